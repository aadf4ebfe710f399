//! virtio-net descriptor chains against real guest memory and a real frame socket peer: the
//! input decides the guest's tx chains (header and frame buffers of any shape), its rx
//! buffers, raw ring corruption, the frames the daemon's side sends (any length, including
//! ones the contract forbids) and peers that connect and replace each other. The device must
//! never panic, must stay inside guest memory, must never claim to have written more than a
//! header and a frame of the MTU into an rx chain, and must only ever send the peer frames of
//! 14 to `mtu + 14` bytes.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use belljar_vmm::devices::CountingInterrupt;
use belljar_vmm::devices::virtio::net::{NET_HDR_LEN, Net, RX_QUEUE, TX_QUEUE};
use belljar_vmm::devices::virtio::{VirtioDevice, VirtioInterrupt};
use belljar_vmm::memory::GuestMemory;
use belljar_vmm_api::net::{MacAddr, NetConfig};
use nix::sys::socket::{self, AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr};
use vm_memory::{Bytes, GuestAddress};

use crate::input::Input;
use crate::virtqueue::{MEM_SIZE, TestQueue, address, length};

const QUEUE_SIZE: u16 = 16;
const MTU: u16 = 1500;
const MAX_FRAME: usize = MTU as usize + 14;
#[expect(clippy::cast_possible_truncation, reason = "the header is 12 bytes")]
const HDR_LEN: u32 = NET_HDR_LEN as u32;
/// The most the device may write into one receive chain: a header and the largest frame.
#[expect(clippy::cast_possible_truncation, reason = "12 + 1514 bytes")]
const RX_BUF_LEN: u32 = (NET_HDR_LEN + MAX_FRAME) as u32;

fn socket_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("belljar-fuzz-net-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir.join("net.sock")
    })
}

/// The daemon's end: a non-blocking `SOCK_SEQPACKET` connection to the device's listener.
fn connect() -> Option<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .ok()?;
    let addr = UnixAddr::new(socket_path()).ok()?;
    socket::connect(fd.as_raw_fd(), &addr).ok()?;
    Some(fd)
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let Ok(mem) = belljar_vmm::memory::create(MEM_SIZE) else {
        return;
    };
    let mut rx = TestQueue::new(&mem, 0x1000, QUEUE_SIZE);
    let mut tx = TestQueue::new(&mem, 0x3000, QUEUE_SIZE);
    let mut net = Net::new(&NetConfig {
        socket: socket_path().clone(),
        mac: MacAddr([2, 0x62, 0x6a, 0, 0, 2]),
        mtu: MTU,
    })
    .expect("frame socket binds");
    let irq = Arc::new(VirtioInterrupt::new(Arc::new(CountingInterrupt::default())));
    net.activate(mem.clone(), irq, vec![rx.queue(), tx.queue()])
        .expect("activates");
    let mut peer = connect();
    net.handle_host_events();
    let (mut next_rx, mut next_tx): (u16, u16) = (0, 0);
    let mut steps = 0;
    while !input.is_empty() && steps < 64 {
        steps += 1;
        match input.u8() % 7 {
            0 => {
                // A frame from the guest: the header buffer, then frame buffers.
                let hdr_len = if input.one_in(8) {
                    u32::from(input.u8())
                } else {
                    HDR_LEN
                };
                let mut descs = vec![(address(&mut input), hdr_len, input.one_in(8))];
                for _ in 0..input.u8() % 4 {
                    descs.push((address(&mut input), length(&mut input), input.one_in(8)));
                }
                next_tx = tx.add_chain(&mem, next_tx, &descs);
            }
            1 => {
                let mut descs = Vec::new();
                for _ in 0..1 + input.u8() % 3 {
                    descs.push((address(&mut input), length(&mut input), !input.one_in(8)));
                }
                next_rx = rx.add_chain(&mem, next_rx, &descs);
            }
            2 => {
                if input.bool() {
                    rx.raw_action(&mem, &mut input);
                } else {
                    tx.raw_action(&mem, &mut input);
                }
            }
            3 => {
                // A frame from the daemon's side, of any length (1 to 64 KiB).
                let len = match input.u8() % 4 {
                    0 => usize::from(input.u16()).max(1),
                    _ => 1 + usize::from(input.u16()) % (MAX_FRAME + 20),
                };
                let mut frame = input.bytes(len.min(64)).to_vec();
                frame.resize(len, 0);
                if let Some(p) = &peer {
                    let _ = socket::send(p.as_raw_fd(), &frame, MsgFlags::MSG_DONTWAIT);
                }
            }
            4 => {
                let (rx_before, tx_before) = (rx.used_idx(&mem), tx.used_idx(&mem));
                net.queue_notify(match input.u8() % 3 {
                    0 => RX_QUEUE,
                    1 => TX_QUEUE,
                    _ => u16::from(input.u8()),
                });
                check_used(&mem, &rx, rx_before, RX_BUF_LEN);
                check_used(&mem, &tx, tx_before, 0);
            }
            5 => {
                let rx_before = rx.used_idx(&mem);
                net.handle_host_events();
                check_used(&mem, &rx, rx_before, RX_BUF_LEN);
                drain(peer.as_ref());
            }
            _ => {
                // A restarted daemon: a new peer replaces the old one.
                peer = connect();
                net.handle_host_events();
            }
        }
    }
    let tx_before = tx.used_idx(&mem);
    net.queue_notify(TX_QUEUE);
    check_used(&mem, &tx, tx_before, 0);
    drain(peer.as_ref());
    net.reset();
    assert!(!net.is_activated());
}

/// Reads every frame the device sent; each must be a whole Ethernet frame within the MTU.
fn drain(peer: Option<&OwnedFd>) {
    let Some(peer) = peer else { return };
    let mut buf = vec![0u8; 70000];
    while let Ok(n) = socket::recv(peer.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
        if n == 0 {
            return;
        }
        assert!(
            (14..=MAX_FRAME).contains(&n),
            "device sent a {n}-byte frame"
        );
    }
}

/// Every used element names a descriptor inside the table and reports at most `max_len`
/// bytes written.
fn check_used(mem: &GuestMemory, q: &TestQueue, before: u16, max_len: u32) {
    let added = q.used_idx(mem).wrapping_sub(before);
    assert!(
        added <= q.size,
        "device added {added} used elements to a queue of {}",
        q.size
    );
    for i in 0..added {
        let slot = before.wrapping_add(i) % q.size;
        let at = q.used + 4 + 8 * u64::from(slot);
        let head: u32 = mem.read_obj(GuestAddress(at)).unwrap_or(0);
        assert!(
            head < u32::from(q.size),
            "used head {head} outside the table"
        );
        let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap_or(0);
        assert!(len <= max_len, "device claims {len} bytes written");
    }
}
