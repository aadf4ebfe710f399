//! The real `belljard` binary in a temporary home, and raw HTTP/1.1 exchanges with it over
//! its Unix socket and its TCP port, shared by the daemon's integration tests.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use belljar_client::Paths;
use belljar_client::ready::ReadySocket;

pub struct Daemon {
    pub child: Child,
    pub home: tempfile::TempDir,
    pub port: u16,
    pub token: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// A daemon on a free port.
    pub fn start() -> Daemon {
        Daemon::start_with(&["--port", "0"])
    }

    /// A daemon started with these extra flags (and no `BELLJAR_PORT` from the environment).
    pub fn start_with(args: &[&str]) -> Daemon {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::under_home(home.path());
        let cache = home.path().join("cache");
        // The daemon says when it listens (systemd's notify protocol).
        let ready = ReadySocket::bind(home.path()).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_belljard"))
            .args(args)
            .env_remove("BELLJAR_PORT")
            .arg("--home")
            .arg(home.path())
            .arg("--cache")
            .arg(&cache)
            .env("BELLJAR_UI_DIR", home.path().join("no-ui"))
            .env(belljar_client::ready::ENV, ready.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        ready
            .wait_blocking(Duration::from_secs(30))
            .expect("belljard did not get ready");
        let port = paths.port().expect("no port file");
        let token = paths.token().expect("no token");
        Daemon {
            child,
            home,
            port,
            token,
        }
    }

    pub fn socket(&self) -> PathBuf {
        Paths::under_home(self.home.path()).socket()
    }

    /// One HTTP/1.1 request over TCP with exactly these extra headers.
    pub fn tcp(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        exchange(stream, method, path, headers, body)
    }

    pub fn tcp_authed(&self, method: &str, path: &str, body: &str) -> Reply {
        let bearer = format!("Bearer {}", self.token);
        self.tcp(
            method,
            path,
            &[("Host", "127.0.0.1"), ("Authorization", &bearer)],
            body,
        )
    }

    pub fn unix(&self, method: &str, path: &str, body: &str) -> Reply {
        let stream = UnixStream::connect(self.socket()).unwrap();
        exchange(stream, method, path, &[("Host", "belljard")], body)
    }
}

pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

pub fn exchange(
    mut s: impl Read + Write,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Reply {
        status,
        head: head.to_owned(),
        body,
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}
