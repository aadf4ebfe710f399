//! `belljar mcp` in a real MCP session: rmcp's client spawns the CLI over stdio against a real
//! daemon and drives every tool an agent would (create, list, run, write/read/list files,
//! snapshot, restore from the snapshot, stop, delete). Bad input answers a tool error carrying
//! the API's code, and the session survives it.
//!
//! Needs root and the `base` image (as every e2e test).

use belljar_e2e::{Daemon, binary};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

type Session = RunningService<RoleClient, ()>;

async fn call(session: &Session, tool: &'static str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    session
        .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The structured answer of a tool that must succeed.
async fn ok(session: &Session, tool: &'static str, args: Value) -> Value {
    let r = call(session, tool, args).await;
    assert_ne!(r.is_error, Some(true), "{tool} failed: {r:?}");
    r.structured_content
        .unwrap_or_else(|| panic!("{tool}: no structured content"))
}

/// The API error code of a tool call that must fail.
async fn error_code(session: &Session, tool: &'static str, args: Value) -> String {
    let r = call(session, tool, args).await;
    assert_eq!(r.is_error, Some(true), "{tool} should fail: {r:?}");
    let body = r.structured_content.expect("error body");
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"].as_str().expect("code").to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_drives_sandboxes_through_mcp() {
    let d = Daemon::start();
    let mut cmd = tokio::process::Command::new(binary("belljar"));
    cmd.arg("mcp")
        .env("BELLJAR_HOME", d.home.path())
        .env("BELLJARD", binary("belljard"));
    let session: Session = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();

    let info = session.peer_info().expect("server info");
    let server = info.server_info.as_ref().expect("server_info");
    assert_eq!(server.name, "belljar");
    let listed = session.list_all_tools().await.unwrap();
    // Each tool describes its arguments (the schema an agent fills in).
    let run = listed.iter().find(|t| t.name == "run_command").unwrap();
    let schema = serde_json::Value::Object((*run.input_schema).clone());
    assert_eq!(
        schema["required"],
        json!(["sandbox_id", "argv"]),
        "{schema}"
    );
    assert_eq!(schema["properties"]["argv"]["type"], "array", "{schema}");
    let mut tools: Vec<String> = listed.into_iter().map(|t| t.name.to_string()).collect();
    tools.sort();
    assert_eq!(
        tools,
        [
            "create_sandbox",
            "delete_sandbox",
            "expose_port",
            "get_sandbox",
            "list_files",
            "list_sandboxes",
            "list_snapshots",
            "read_file",
            "run_command",
            "set_network_policy",
            "snapshot_sandbox",
            "stop_sandbox",
            "write_file",
        ]
    );

    let sbx = ok(
        &session,
        "create_sandbox",
        json!({ "tags": { "by": "mcp" }, "env": { "GREETING": "hi" }, "timeout_seconds": 600 }),
    )
    .await;
    let id = sbx["id"].as_str().unwrap().to_string();
    assert_eq!(sbx["status"], "running");

    let listed = ok(&session, "list_sandboxes", json!({ "tag": "by=mcp" })).await;
    let ids: Vec<&str> = listed["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);

    // Output of both streams, the sandbox's env and a non-zero exit code.
    let run = ok(
        &session,
        "run_command",
        json!({ "sandbox_id": id, "argv": ["sh", "-c", "echo $GREETING; echo oops >&2; exit 3"] }),
    )
    .await;
    assert_eq!(
        (&run["exit_code"], &run["stdout"], &run["stderr"]),
        (&json!(3), &json!("hi\n"), &json!("oops\n"))
    );
    assert_eq!(run["timed_out"], false);

    // A command past its timeout is killed, and says so.
    let slow = ok(
        &session,
        "run_command",
        json!({ "sandbox_id": id, "argv": ["sleep", "60"], "timeout_seconds": 1 }),
    )
    .await;
    assert_eq!(
        (&slow["timed_out"], &slow["signal"]),
        (&json!(true), &json!(9))
    );

    // Files: text, binary (base64) with a mode, and a listing.
    ok(
        &session,
        "write_file",
        json!({ "sandbox_id": id, "path": "/workspace/notes/a.txt", "content": "héllo\n" }),
    )
    .await;
    let bin = ok(
        &session,
        "write_file",
        json!({ "sandbox_id": id, "path": "/workspace/notes/run.bin", "content": "/wAB",
                "encoding": "base64", "mode": "755" }),
    )
    .await;
    assert_eq!((&bin["size"], &bin["mode"]), (&json!(3), &json!(0o755)));
    let text = ok(
        &session,
        "read_file",
        json!({ "sandbox_id": id, "path": "/workspace/notes/a.txt" }),
    )
    .await;
    assert_eq!(
        (&text["encoding"], &text["content"]),
        (&json!("utf8"), &json!("héllo\n"))
    );
    let raw = ok(
        &session,
        "read_file",
        json!({ "sandbox_id": id, "path": "/workspace/notes/run.bin" }),
    )
    .await;
    assert_eq!(
        (&raw["encoding"], &raw["content"]),
        (&json!("base64"), &json!("/wAB"))
    );
    let dir = ok(
        &session,
        "list_files",
        json!({ "sandbox_id": id, "path": "/workspace/notes" }),
    )
    .await;
    let names: Vec<&str> = dir["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.txt", "run.bin"]);

    // Bad input: the API's codes, and the session goes on.
    assert_eq!(
        error_code(
            &session,
            "get_sandbox",
            json!({ "sandbox_id": "sbx_nosuch" })
        )
        .await,
        "not_found"
    );
    assert_eq!(
        error_code(
            &session,
            "read_file",
            json!({ "sandbox_id": id, "path": "/workspace/missing" })
        )
        .await,
        "not_found"
    );
    assert_eq!(
        error_code(
            &session,
            "run_command",
            json!({ "sandbox_id": id, "argv": [] })
        )
        .await,
        "bad_request"
    );
    assert_eq!(
        error_code(
            &session,
            "write_file",
            json!({ "sandbox_id": id, "path": "/workspace/x", "content": "", "mode": "9" })
        )
        .await,
        "bad_request"
    );
    assert_eq!(
        error_code(&session, "list_sandboxes", json!({ "status": "asleep" })).await,
        "bad_request"
    );
    // Limits out of range: a timeout of 0 s, and one past the daemon's 30 days.
    for timeout in [0_u64, 31 * 24 * 3600] {
        assert_eq!(
            error_code(
                &session,
                "create_sandbox",
                json!({ "timeout_seconds": timeout })
            )
            .await,
            "bad_request",
            "timeout_seconds {timeout}"
        );
    }
    // Arguments that do not fit a tool's schema: the same code, as a tool error.
    for (tool, args) in [
        ("create_sandbox", json!({ "image": 5 })),
        ("get_sandbox", json!({})),
        (
            "read_file",
            json!({ "sandbox_id": id, "path": "/x", "bogus": true }),
        ),
    ] {
        assert_eq!(
            error_code(&session, tool, args).await,
            "bad_request",
            "{tool}"
        );
    }

    // Network: deny-all (DNS too), replaced live; a port exposed on the host.
    let net = ok(
        &session,
        "set_network_policy",
        json!({ "sandbox_id": id, "policy": "deny-all" }),
    )
    .await;
    assert_eq!(net["policy"], "deny-all");
    let dns = ok(
        &session,
        "run_command",
        json!({ "sandbox_id": id, "argv": ["getent", "hosts", "a.test"] }),
    )
    .await;
    assert_ne!(dns["exit_code"], 0);
    let rules = json!({ "subnets": { "allow": ["203.0.113.0/24"], "deny": [] } });
    let net = ok(
        &session,
        "set_network_policy",
        json!({ "sandbox_id": id, "policy": rules }),
    )
    .await;
    assert_eq!(net["policy"], rules);
    let port = ok(
        &session,
        "expose_port",
        json!({ "sandbox_id": id, "port": 8000 }),
    )
    .await;
    assert_eq!(port["port"], 8000);
    assert!(
        port["url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    assert_eq!(
        error_code(
            &session,
            "set_network_policy",
            json!({ "sandbox_id": id, "policy": "allow-some" })
        )
        .await,
        "bad_request"
    );
    assert_eq!(
        error_code(
            &session,
            "set_network_policy",
            json!({ "sandbox_id": id, "policy": { "subnets": { "allow": ["nope"], "deny": [] } } })
        )
        .await,
        "bad_request"
    );

    // Snapshot (the sandbox keeps running), then restore it into a new sandbox.
    let snap = ok(
        &session,
        "snapshot_sandbox",
        json!({ "sandbox_id": id, "keep_running": true }),
    )
    .await;
    let snap_id = snap["id"].as_str().unwrap().to_string();
    assert_eq!(snap["source_sandbox_id"], json!(id));
    let snaps = ok(&session, "list_snapshots", json!({ "sandbox_id": id })).await;
    assert_eq!(snaps["snapshots"][0]["id"], json!(snap_id));
    let restored = ok(
        &session,
        "create_sandbox",
        json!({ "snapshot_id": snap_id, "tags": { "by": "mcp" }, "network_policy": "deny-all" }),
    )
    .await;
    assert_eq!(restored["network_policy"], "deny-all");
    // A host folder, mounted live.
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(folder.path().join("f"), "from the host\n").unwrap();
    let mounted = ok(
        &session,
        "create_sandbox",
        json!({ "volumes": [{ "source": folder.path(), "path": "/host", "read_only": true }] }),
    )
    .await;
    assert_eq!(mounted["volumes"][0]["path"], "/host");
    let seen = ok(
        &session,
        "run_command",
        json!({ "sandbox_id": mounted["id"], "argv": ["cat", "/host/f"] }),
    )
    .await;
    assert_eq!(seen["stdout"], "from the host\n", "{seen}");
    ok(
        &session,
        "delete_sandbox",
        json!({ "sandbox_id": mounted["id"] }),
    )
    .await;
    let restored_id = restored["id"].as_str().unwrap().to_string();
    let cat = ok(
        &session,
        "run_command",
        json!({ "sandbox_id": restored_id, "argv": ["cat", "/workspace/notes/a.txt"] }),
    )
    .await;
    assert_eq!(
        (&cat["exit_code"], &cat["stdout"]),
        (&json!(0), &json!("héllo\n"))
    );

    let stopped = ok(&session, "stop_sandbox", json!({ "sandbox_id": id })).await;
    assert_eq!(stopped["status"], "stopped");
    assert_eq!(
        error_code(
            &session,
            "run_command",
            json!({ "sandbox_id": id, "argv": ["true"] })
        )
        .await,
        "sandbox_not_running"
    );
    for sandbox in [&id, &restored_id] {
        ok(&session, "delete_sandbox", json!({ "sandbox_id": sandbox })).await;
    }
    let left = ok(&session, "list_sandboxes", json!({})).await;
    assert_eq!(left, json!({ "sandboxes": [] }));

    session.cancel().await.unwrap();
}
