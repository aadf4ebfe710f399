// A stand-in for `belljar-agent` in tests, compiled at test time with
// `rustc -C target-feature=+crt-static` so it runs on a busybox-only root filesystem.
//
// As `--listen unix:PATH` or `--listen fd:N` (an inherited listening socket) it is PID 1: each connection sends one shell command (until it shuts
// down its write half) and receives the merged stdout/stderr followed by `\0EXIT <code>\n`.
// It reaps every orphan; exit statuses of its own commands are dispatched by pid.
// As `connect PATH`, `connect-abstract NAME` or `connect-tcp ADDR:PORT` it tries to connect
// and exits 0 on success, 1 otherwise (used by escape tests); `listen PATH` binds a Unix socket
// at PATH and accepts on it until killed (their control: a socket the sandbox made itself). `syscall NR [ARG...]` prints the
// errno of a raw system call, to see what the seccomp filter refuses.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

unsafe extern "C" {
    fn syscall(nr: i64, a: i64, b: i64, c: i64, d: i64, e: i64, f: i64) -> i64;
    fn __errno_location() -> *mut i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn signal(sig: i32, handler: usize) -> usize;
    fn _exit(code: i32) -> !;
}

extern "C" fn on_term(_: i32) {
    unsafe { _exit(0) }
}

type Statuses = Arc<(Mutex<HashMap<i32, i32>>, Condvar)>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("connect") => {
            let ok = UnixStream::connect(&args[2]).is_ok();
            std::process::exit(if ok { 0 } else { 1 });
        }
        Some("listen") => {
            let _ = std::fs::remove_file(&args[2]);
            let listener = UnixListener::bind(&args[2]).expect("bind");
            for conn in listener.incoming() {
                drop(conn);
            }
            std::process::exit(0);
        }
        Some("syscall") => {
            // `syscall NR [ARG...]`: prints the errno of the raw system call (0 on success).
            let mut a = [0i64; 6];
            for (slot, arg) in a.iter_mut().zip(&args[3..]) {
                *slot = arg.parse().expect("integer argument");
            }
            let nr: i64 = args[2].parse().expect("syscall number");
            let ret = unsafe { syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
            let errno = if ret < 0 { unsafe { *__errno_location() } } else { 0 };
            println!("{errno}");
            std::process::exit(0);
        }
        Some("connect-tcp") => {
            let ok = std::net::TcpStream::connect_timeout(
                &args[2].parse().expect("HOST:PORT"),
                Duration::from_secs(1),
            )
            .is_ok();
            std::process::exit(if ok { 0 } else { 1 });
        }
        Some("connect-abstract") => {
            let ok = SocketAddr::from_abstract_name(args[2].as_bytes())
                .and_then(|a| UnixStream::connect_addr(&a))
                .is_ok();
            std::process::exit(if ok { 0 } else { 1 });
        }
        _ => {}
    }
    let listen = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .expect("--listen unix:PATH or fd:N")
        .to_owned();
    unsafe {
        signal(15, on_term as *const () as usize);
        // Like belljar-agent once eth0 is up: CAP_NET_ADMIN (12) leaves the bounding set, so
        // no command gets it (prctl = 157, PR_CAPBSET_DROP = 24).
        syscall(157, 24, 12, 0, 0, 0, 0);
    }
    let statuses: Statuses = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
    let reaper = statuses.clone();
    std::thread::spawn(move || loop {
        let mut st = 0;
        let pid = unsafe { waitpid(-1, &mut st, 0) };
        if pid > 0 {
            reaper.0.lock().unwrap().insert(pid, st);
            reaper.1.notify_all();
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let listener = match listen.strip_prefix("fd:") {
        // An inherited, already listening socket (how the namespace backend starts PID 1).
        Some(fd) => unsafe {
            <UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd.parse().expect("fd:N"))
        },
        None => {
            let path = listen.strip_prefix("unix:").expect("--listen unix:PATH or fd:N");
            let _ = std::fs::remove_file(path);
            UnixListener::bind(path).expect("bind")
        }
    };
    for conn in listener.incoming().flatten() {
        let statuses = statuses.clone();
        let _ = std::thread::Builder::new().spawn(move || serve(conn, statuses));
    }
}

fn serve(mut conn: UnixStream, statuses: Statuses) {
    let mut cmd = String::new();
    if conn.read_to_string(&mut cmd).is_err() {
        return;
    }
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec 2>&1; {cmd}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = write!(conn, "spawn failed: {e}\0EXIT 126\n");
            return;
        }
    };
    let pid = child.id() as i32;
    if let Some(mut out) = child.stdout.take() {
        let _ = std::io::copy(&mut out, &mut conn);
    }
    let (lock, cv) = &*statuses;
    let mut map = lock.lock().unwrap();
    let st = loop {
        if let Some(st) = map.remove(&pid) {
            break st;
        }
        map = cv.wait(map).unwrap();
    };
    drop(map);
    let code = if st & 0x7f == 0 { (st >> 8) & 0xff } else { 128 + (st & 0x7f) };
    let _ = write!(conn, "\0EXIT {code}\n");
    drop(child);
}
