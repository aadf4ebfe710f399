//! virtio-vsock from both sides at once: the guest's tx chains and packet headers (ops,
//! CIDs, ports, lengths, credit fields) and rx buffers of any shape, and host clients of the
//! hybrid socket sending `CONNECT <port>\n` lines (or anything else) and data. The device
//! must never panic, never hand the guest a packet longer than its buffers, and keep its
//! connection count within its limit.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use belljar_vmm::devices::CountingInterrupt;
use belljar_vmm::devices::virtio::vsock::{
    HOST_CID, MAX_CONNECTIONS, MAX_PKT_DATA, RX_QUEUE, TX_QUEUE, Vsock, VsockConfig,
};
use belljar_vmm::devices::virtio::{VirtioDevice, VirtioInterrupt};
use vm_memory::{Bytes, GuestAddress};

use crate::input::Input;
use crate::virtqueue::{DATA_BASE, MEM_SIZE, TestQueue, address, length};

const GUEST_CID: u64 = 3;
const HEADER_SIZE: usize = 44;
#[expect(clippy::cast_possible_truncation, reason = "the header is 44 bytes")]
const HEADER_LEN: u32 = HEADER_SIZE as u32;
const QUEUE_SIZE: u16 = 32;
/// The host port a listener waits on, so that guest connections can succeed.
const LISTENING_PORT: u32 = 52;

struct Host {
    dir: PathBuf,
    listener: UnixListener,
}

fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("belljar-fuzz-vsock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let listener = UnixListener::bind(dir.join(format!("v.sock_{LISTENING_PORT}")))
            .expect("host listener");
        listener.set_nonblocking(true).expect("nonblocking");
        Host { dir, listener }
    })
}

fn header(input: &mut Input, payload_len: usize) -> [u8; HEADER_SIZE] {
    let src_cid = if input.one_in(8) {
        input.u64()
    } else {
        GUEST_CID
    };
    let dst_cid = if input.one_in(8) {
        input.u64()
    } else {
        HOST_CID
    };
    let src_port = match input.u8() % 4 {
        0 => input.u32(),
        _ => 1000 + u32::from(input.u8() % 4),
    };
    let dst_port = match input.u8() % 4 {
        0 => input.u32(),
        1 => (1 << 30) + u32::from(input.u8() % 4),
        _ => LISTENING_PORT,
    };
    let len = if input.one_in(8) {
        input.u32()
    } else {
        // Payloads are at most a few hundred bytes; a length that did not fit would be as
        // hostile as any other, so saturating is fine.
        u32::try_from(payload_len).unwrap_or(u32::MAX)
    };
    let type_: u16 = if input.one_in(8) { input.u16() } else { 1 };
    let op: u16 = u16::from(input.u8() % 9);
    let flags = u32::from(input.u8() % 4);
    let buf_alloc = if input.bool() { input.u32() } else { 65536 };
    let fwd_cnt = if input.bool() { input.u32() } else { 0 };
    let mut h = [0u8; HEADER_SIZE];
    h[0..8].copy_from_slice(&src_cid.to_le_bytes());
    h[8..16].copy_from_slice(&dst_cid.to_le_bytes());
    h[16..20].copy_from_slice(&src_port.to_le_bytes());
    h[20..24].copy_from_slice(&dst_port.to_le_bytes());
    h[24..28].copy_from_slice(&len.to_le_bytes());
    h[28..30].copy_from_slice(&type_.to_le_bytes());
    h[30..32].copy_from_slice(&op.to_le_bytes());
    h[32..36].copy_from_slice(&flags.to_le_bytes());
    h[36..40].copy_from_slice(&buf_alloc.to_le_bytes());
    h[40..44].copy_from_slice(&fwd_cnt.to_le_bytes());
    h
}

pub fn run(data: &[u8]) {
    let host = host();
    // Connections the device made to the host listener in an earlier run are gone with it.
    while host.listener.accept().is_ok() {}
    let mut input = Input::new(data);
    let Ok(mem) = belljar_vmm::memory::create(MEM_SIZE) else {
        return;
    };
    let mut rx = TestQueue::new(&mem, 0x1000, QUEUE_SIZE);
    let mut tx = TestQueue::new(&mem, 0x2000, QUEUE_SIZE);
    let ev = TestQueue::new(&mem, 0x3000, QUEUE_SIZE);
    let uds = host.dir.join("v.sock");
    let mut dev = Vsock::new(VsockConfig {
        guest_cid: GUEST_CID,
        uds_path: uds.clone(),
    })
    .expect("vsock device");
    let irq = Arc::new(VirtioInterrupt::new(Arc::new(CountingInterrupt::default())));
    dev.activate(
        mem.clone(),
        irq.clone(),
        vec![rx.queue(), tx.queue(), ev.queue()],
    )
    .expect("activates");
    // Host ends: clients of the hybrid socket, and connections the device made to us.
    let mut streams: Vec<UnixStream> = Vec::new();
    let (mut next_tx, mut next_rx) = (0u16, 0u16);
    let mut steps = 0;
    while !input.is_empty() && steps < 64 {
        steps += 1;
        match input.u8() % 8 {
            0 | 1 => {
                // A guest packet, its header and payload split over up to three buffers.
                let payload = input.string(300);
                let h = header(&mut input, payload.len());
                let mut bytes = h.to_vec();
                bytes.extend_from_slice(payload);
                let at = DATA_BASE + u64::from(input.u16() % 0x100) * 0x800;
                let _ = mem.write_slice(&bytes, GuestAddress(at));
                let mut descs = Vec::new();
                let mut off = 0usize;
                for _ in 0..1 + input.u8() % 3 {
                    let n = match input.u8() % 4 {
                        0 => usize::from(input.u8()),
                        _ => bytes.len() - off,
                    }
                    .min(bytes.len() - off);
                    descs.push((at + off as u64, u32::try_from(n).unwrap_or(u32::MAX), false));
                    off += n;
                }
                if input.one_in(8) {
                    descs.push((address(&mut input), length(&mut input), input.bool()));
                }
                next_tx = tx.add_chain(&mem, next_tx, &descs);
                dev.queue_notify(TX_QUEUE);
            }
            2 => {
                // Rx buffers: whole 4 KiB, Linux's header + payload split, or anything.
                for _ in 0..1 + input.u8() % 4 {
                    let at = DATA_BASE + 0x80000 + u64::from(next_rx % QUEUE_SIZE) * 0x1000;
                    let descs = match input.u8() % 4 {
                        0 => vec![(at, HEADER_LEN, true), (at + 0x100, 0xf00, true)],
                        1 => vec![(address(&mut input), length(&mut input), input.bool())],
                        _ => vec![(at, 0x1000, true)],
                    };
                    next_rx = rx.add_chain(&mem, next_rx, &descs);
                }
                dev.queue_notify(RX_QUEUE);
            }
            3 => {
                // A host client of the hybrid socket with its first line (or junk).
                if let Ok(mut s) = UnixStream::connect(&uds) {
                    let line = match input.u8() % 4 {
                        0 => input.string(64).to_vec(),
                        n => format!("CONNECT {}\n", 1000 + u32::from(n)).into_bytes(),
                    };
                    let _ = s.set_nonblocking(true);
                    let _ = s.write_all(&line);
                    streams.push(s);
                }
                dev.handle_host_events();
            }
            4 => {
                // A host end writes data (or half a line) or hangs up.
                let i = usize::from(input.u8());
                let hang_up = input.one_in(4);
                let bytes = input.string(1024);
                if !streams.is_empty() {
                    let i = i % streams.len();
                    if hang_up {
                        streams.swap_remove(i);
                    } else {
                        let _ = streams[i].write(bytes);
                    }
                }
                dev.handle_host_events();
            }
            5 => {
                while let Ok((s, _)) = host.listener.accept() {
                    let _ = s.set_nonblocking(true);
                    streams.push(s);
                }
            }
            6 => {
                if input.bool() {
                    rx.raw_action(&mem, &mut input);
                } else {
                    tx.raw_action(&mem, &mut input);
                }
            }
            _ => match input.u8() % 8 {
                0 => {
                    // The driver resets the device and sets it up again.
                    dev.reset();
                    rx = TestQueue::new(&mem, 0x1000, QUEUE_SIZE);
                    tx = TestQueue::new(&mem, 0x2000, QUEUE_SIZE);
                    (next_tx, next_rx) = (0, 0);
                    dev.activate(
                        mem.clone(),
                        irq.clone(),
                        vec![rx.queue(), tx.queue(), ev.queue()],
                    )
                    .expect("activates again");
                }
                n => dev.queue_notify(u16::from(n)),
            },
        }
        assert!(dev.connection_count() <= MAX_CONNECTIONS);
        check_used(&mem, &rx);
        check_used(&mem, &tx);
    }
    dev.handle_host_events();
    dev.reset();
    assert_eq!(dev.connection_count(), 0, "reset leaves no connection");
}

/// Every used element names a descriptor inside the table and is at most one packet long.
fn check_used(mem: &belljar_vmm::memory::GuestMemory, q: &TestQueue) {
    for slot in 0..u64::from(q.size) {
        let at = q.used + 4 + 8 * slot;
        let head: u32 = mem.read_obj(GuestAddress(at)).unwrap_or(0);
        let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap_or(0);
        assert!(
            head < u32::from(q.size),
            "used head {head} outside the table"
        );
        assert!(
            len as usize <= HEADER_SIZE + MAX_PKT_DATA as usize,
            "used length {len} longer than a packet"
        );
    }
}
