//! `belljar templates create|update|ls|inspect|rm`: an image plus the defaults of the sandboxes
//! made from it and the size of its warm pool.

use std::fmt::Write as _;

use anyhow::Result;
use belljar_api::{CreateTemplate, Template};
use belljar_cli::duration::parse_ms;
use belljar_cli::output::{ago, now_ms, table};
use belljar_client::Client;

use crate::args::{TemplateCreateArgs, TemplatesCmd};
use crate::commands::{backend_choice, key_values, print_json};

pub async fn templates(client: &Client, action: TemplatesCmd, json: bool) -> Result<i32> {
    match action {
        TemplatesCmd::Create(a) => {
            let t = client.create_template(&request(*a)?).await?;
            if json {
                print_json(&t)?;
            } else {
                outln!("{}", t.name)?;
            }
        }
        TemplatesCmd::Update(a) => {
            let t = client.replace_template(&request(*a)?).await?;
            if json {
                print_json(&t)?;
            } else {
                outln!("{}", t.name)?;
            }
        }
        TemplatesCmd::Ls => {
            let list = client.list_templates().await?;
            if json {
                print_json(&list)?;
            } else {
                out!("{}", rows(&list.templates, now_ms()))?;
            }
        }
        TemplatesCmd::Inspect { name } => {
            let t = client.template(&name).await?;
            if json {
                print_json(&t)?;
            } else {
                out!("{}", block(&t, now_ms()))?;
            }
        }
        TemplatesCmd::Rm { names } => {
            for n in &names {
                client.delete_template(n).await?;
                if !json {
                    outln!("{n}")?;
                }
            }
        }
    }
    Ok(0)
}

fn request(a: TemplateCreateArgs) -> Result<CreateTemplate> {
    let env = key_values("--env", &a.env)?;
    Ok(CreateTemplate {
        backend: backend_choice(a.backend.as_deref())?,
        vcpus: a.vcpus,
        memory_mib: a.memory,
        disk_mib: a.disk,
        timeout_ms: a.timeout.as_deref().map(parse_ms).transpose()?,
        env: (!env.is_empty()).then_some(env),
        network_policy: crate::netcmd::policy(&a.policy)?,
        pool: a.pool,
        name: a.name,
        image: a.image,
    })
}

/// `ready/target`, or `-` without a pool.
fn pool(t: &Template) -> String {
    if t.pool == 0 {
        "-".into()
    } else {
        format!("{}/{}", t.pool_ready, t.pool)
    }
}

fn or_default<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v}{unit}"))
}

fn rows(list: &[Template], now: i64) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.image.clone(),
                pool(t),
                or_default(t.memory_mib, " MiB"),
                or_default(t.vcpus, ""),
                or_default(t.timeout_ms.map(|ms| ms / 1000), "s"),
                ago(t.created_at, now),
            ]
        })
        .collect();
    table(
        &[
            "NAME", "IMAGE", "POOL", "MEMORY", "VCPUS", "TIMEOUT", "CREATED",
        ],
        &rows,
    )
}

fn block(t: &Template, now: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "name:      {}", t.name);
    let _ = writeln!(out, "image:     {}", t.image);
    let _ = writeln!(
        out,
        "pool:      {} ready, {} starting, of {}",
        t.pool_ready, t.pool_starting, t.pool
    );
    let _ = writeln!(out, "memory:    {}", or_default(t.memory_mib, " MiB"));
    let _ = writeln!(out, "vcpus:     {}", or_default(t.vcpus, ""));
    let _ = writeln!(out, "disk:      {}", or_default(t.disk_mib, " MiB"));
    let _ = writeln!(
        out,
        "timeout:   {}",
        or_default(t.timeout_ms.map(|ms| ms / 1000), "s")
    );
    if let Some(b) = t.backend {
        let _ = writeln!(out, "backend:   {b}");
    }
    for (k, v) in &t.env {
        let _ = writeln!(out, "env:       {k}={v}");
    }
    if let Some(p) = &t.network_policy {
        let _ = writeln!(
            out,
            "network:   {}",
            serde_json::to_string(p).unwrap_or_default()
        );
    }
    let _ = writeln!(out, "created:   {}", ago(t.created_at, now));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_reads_ready_of_target() {
        let spec = CreateTemplate {
            name: "py".into(),
            image: "python3.13".into(),
            pool: Some(2),
            ..Default::default()
        };
        let t = Template::new(&spec, 0, 1, 1);
        assert_eq!(pool(&t), "1/2");
        let none = Template::new(&CreateTemplate { pool: None, ..spec }, 0, 0, 0);
        assert_eq!(pool(&none), "-");
        let table = rows(&[t], 1000);
        assert!(table.contains("python3.13"), "{table}");
        assert!(table.contains("1/2"), "{table}");
    }
}
