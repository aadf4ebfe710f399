//! A microVM's network on the host, both halves real: the VMM's virtio-net device (`Net` on
//! real guest memory, woken by its own event-loop thread exactly as `belljar-vmm` runs it) and
//! the daemon's stack on its end of the frame socket (`SeqpacketDevice`, as the daemon attaches
//! it to a microVM), in the order a sandbox starts them. The test is the guest's driver: it
//! posts receive buffers, transmits behind a virtio-net header and waits for the device's
//! interrupt, and its TCP/IP is a smoltcp interface configured as the agent configures `eth0`.
//!
//! It lives in this crate because this is the one crate that links both the VMM and the
//! daemon's network (and has a virtqueue laid out in guest memory).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use belljar_fuzz_harness::virtqueue::{DATA_BASE, MEM_SIZE, TestQueue};
use belljar_network::config::{GATEWAY_MAC, GATEWAY_V4, GUEST_MAC, GUEST_V4, MTU, PREFIX_V4};
use belljar_network::{DnsUpstream, Network, Options, SeqpacketDevice};
use belljar_vmm::devices::Interrupt;
use belljar_vmm::devices::virtio::net::{NET_HDR_LEN, Net, RX_QUEUE, TX_QUEUE};
use belljar_vmm::devices::virtio::{VirtioDevice, VirtioInterrupt};
use belljar_vmm::memory::GuestMemory;
use belljar_vmm_api::net::{MacAddr, NetConfig};
use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, HardwareAddress, IpCidr,
};
use vm_memory::{Bytes, GuestAddress};

/// How long one step may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);
const QUEUE_SIZE: u16 = 16;
/// Each receive buffer: a header and the largest frame, in one descriptor (Linux's "small"
/// buffers without mergeable rx buffers).
#[expect(clippy::cast_possible_truncation, reason = "12 + 1500 + 14 bytes")]
const RX_BUF: u32 = (NET_HDR_LEN + MTU + 14) as u32;
const RX_BUFS: u64 = DATA_BASE;
const TX_BUFS: u64 = DATA_BASE + 0x10000;
const SLOT: u64 = 0x800;

/// The guest's interrupt line: counts, and wakes whoever waits for it.
#[derive(Default)]
struct Line {
    raised: Mutex<u64>,
    cv: Condvar,
}

impl Interrupt for Line {
    fn trigger(&self) {
        *self.raised.lock().unwrap() += 1;
        self.cv.notify_all();
    }
}

/// The device thread of `belljar-vmm`: the event manager that wakes the device when its
/// frame socket has something.
struct DeviceThread {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

impl DeviceThread {
    fn start(net: Arc<Mutex<Net>>) -> Self {
        let mut manager: EventManager<Subscriber> = EventManager::new().unwrap();
        manager.add_subscriber(net);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                manager.run_with_timeout(50).unwrap();
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The guest's virtio-net driver.
struct Driver {
    mem: GuestMemory,
    net: Arc<Mutex<Net>>,
    line: Arc<Line>,
    rx: TestQueue,
    tx: TestQueue,
    /// Used rx elements already taken.
    rx_seen: u16,
    tx_sent: u16,
    /// Frames received and not yet handed to the stack.
    frames: VecDeque<Vec<u8>>,
}

impl Driver {
    fn new(net: Arc<Mutex<Net>>) -> Self {
        let mem = belljar_vmm::memory::create(MEM_SIZE).unwrap();
        let rx = TestQueue::new(&mem, 0x1000, QUEUE_SIZE);
        let tx = TestQueue::new(&mem, 0x3000, QUEUE_SIZE);
        Self {
            mem,
            net,
            line: Arc::new(Line::default()),
            rx,
            tx,
            rx_seen: 0,
            tx_sent: 0,
            frames: VecDeque::new(),
        }
    }

    /// DRIVER_OK: the transport activates the device; then the driver fills the rx queue
    /// and notifies it (Linux does so when `eth0` goes up).
    fn bring_up(&mut self) {
        let irq = Arc::new(VirtioInterrupt::new(self.line.clone()));
        let mut net = self.net.lock().unwrap();
        net.activate(
            self.mem.clone(),
            irq,
            vec![self.rx.queue(), self.tx.queue()],
        )
        .unwrap();
        for i in 0..QUEUE_SIZE {
            self.rx.add_chain(
                &self.mem,
                i,
                &[(RX_BUFS + u64::from(i) * SLOT, RX_BUF, true)],
            );
        }
        net.queue_notify(RX_QUEUE);
    }

    /// Transmits one frame behind a zeroed header, header and frame in two descriptors.
    fn transmit(&mut self, frame: &[u8]) {
        let slot = self.tx_sent % (QUEUE_SIZE / 2);
        let at = TX_BUFS + u64::from(slot) * 2 * SLOT;
        self.mem
            .write_slice(&[0; NET_HDR_LEN], GuestAddress(at))
            .unwrap();
        self.mem
            .write_slice(frame, GuestAddress(at + SLOT))
            .unwrap();
        self.tx.add_chain(
            &self.mem,
            slot * 2,
            &[
                (at, u32::try_from(NET_HDR_LEN).unwrap(), false),
                (at + SLOT, u32::try_from(frame.len()).unwrap(), false),
            ],
        );
        self.tx_sent += 1;
        self.net.lock().unwrap().queue_notify(TX_QUEUE);
    }

    /// Takes what the device put in the rx queue, giving each buffer back.
    fn take_received(&mut self) {
        let used = self.rx.used_idx(&self.mem);
        let mut reposted = false;
        while self.rx_seen != used {
            let at = self.rx.used + 4 + 8 * u64::from(self.rx_seen % QUEUE_SIZE);
            let head: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
            let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
            let buf = RX_BUFS + u64::from(head) * SLOT;
            let mut data = vec![0u8; len as usize];
            self.mem.read_slice(&mut data, GuestAddress(buf)).unwrap();
            if data.len() > NET_HDR_LEN {
                self.frames.push_back(data.split_off(NET_HDR_LEN));
            }
            let head = u16::try_from(head).unwrap();
            self.rx.add_chain(&self.mem, head, &[(buf, RX_BUF, true)]);
            self.rx_seen = self.rx_seen.wrapping_add(1);
            reposted = true;
        }
        if reposted {
            self.net.lock().unwrap().queue_notify(RX_QUEUE);
        }
    }

    /// Waits up to `wait` for the device's interrupt, then takes what it received.
    fn wait_interrupt(&mut self, wait: Duration) {
        let raised = self.line.raised.lock().unwrap();
        let seen = *raised;
        let _ = self
            .line
            .cv
            .wait_timeout_while(raised, wait, |n| *n == seen)
            .unwrap();
        self.take_received();
    }
}

/// The guest's IP stack speaks through the driver.
struct RxTok(Vec<u8>);
struct TxTok<'a>(&'a mut Driver);

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0; len];
        let r = f(&mut frame);
        self.0.transmit(&frame);
        r
    }
}

impl phy::Device for Driver {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(RxTok, TxTok<'_>)> {
        self.take_received();
        let f = self.frames.pop_front()?;
        Some((RxTok(f), TxTok(self)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<TxTok<'_>> {
        Some(TxTok(self))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MTU + 14;
        caps
    }
}

fn arp(op: ArpOperation, target_mac: [u8; 6], target_ip: Ipv4Addr, dst: [u8; 6]) -> Vec<u8> {
    let arp = ArpRepr::EthernetIpv4 {
        operation: op,
        source_hardware_addr: EthernetAddress(GUEST_MAC),
        source_protocol_addr: GUEST_V4,
        target_hardware_addr: EthernetAddress(target_mac),
        target_protocol_addr: target_ip,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(GUEST_MAC),
        dst_addr: EthernetAddress(dst),
        ethertype: EthernetProtocol::Arp,
    };
    let mut frame = vec![0u8; 14 + arp.buffer_len()];
    let mut f = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.emit(&mut f);
    arp.emit(&mut ArpPacket::new_unchecked(f.payload_mut()));
    frame
}

fn parse_arp(frame: &[u8]) -> Option<ArpRepr> {
    let f = EthernetFrame::new_checked(frame).ok()?;
    if f.ethertype() != EthernetProtocol::Arp {
        return None;
    }
    ArpRepr::parse(&ArpPacket::new_checked(f.payload()).ok()?).ok()
}

#[test]
fn a_microvm_guest_reaches_the_daemons_stack_and_a_forwarded_port_reaches_the_guest() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("net.sock");
    // belljar-vmm starts: it binds the frame socket and runs its device thread.
    let net = Arc::new(Mutex::new(
        Net::new(&NetConfig {
            socket: socket.clone(),
            mac: MacAddr(GUEST_MAC),
            mtu: u16::try_from(MTU).unwrap(),
        })
        .unwrap(),
    ));
    let _device_thread = DeviceThread::start(net.clone());
    // The daemon attaches its stack while the guest still boots.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let network = {
        let _in = rt.enter();
        let options = Options {
            // Nothing here asks a name; this keeps the host's resolver configuration out of it.
            dns: DnsUpstream::Servers(vec![(Ipv4Addr::LOCALHOST, 9).into()]),
            ..Options::default()
        };
        Network::spawn(SeqpacketDevice::new(&socket), options).unwrap()
    };
    // The guest's driver comes up and asks for the gateway, again each 200 ms as a kernel
    // does until it is answered (a frame sent before the device thread has accepted the
    // daemon's connection is lost, as on an unplugged cable).
    let mut guest = Driver::new(net.clone());
    guest.bring_up();
    let request = arp(ArpOperation::Request, [0; 6], GATEWAY_V4, [0xff; 6]);
    let deadline = Instant::now() + DEADLINE;
    let reply = 'answered: loop {
        assert!(Instant::now() < deadline, "the gateway never answered ARP");
        guest.transmit(&request);
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_millis(200) {
            guest.wait_interrupt(Duration::from_millis(50));
            while let Some(f) = guest.frames.pop_front() {
                if let Some(
                    r @ ArpRepr::EthernetIpv4 {
                        operation: ArpOperation::Reply,
                        ..
                    },
                ) = parse_arp(&f)
                {
                    break 'answered r;
                }
            }
        }
    };
    assert_eq!(
        reply,
        ArpRepr::EthernetIpv4 {
            operation: ArpOperation::Reply,
            source_hardware_addr: EthernetAddress(GATEWAY_MAC),
            source_protocol_addr: GATEWAY_V4,
            target_hardware_addr: EthernetAddress(GUEST_MAC),
            target_protocol_addr: GUEST_V4,
        }
    );
    assert!(!network.is_finished());

    // A port exposed on the host reaches a server in the guest: the stack asks for the guest's
    // address, opens the connection, and the bytes cross both ways.
    let forward = {
        let _in = rt.enter();
        network
            .forward(TcpListener::bind("127.0.0.1:0").unwrap(), 8000)
            .unwrap()
    };
    let host = forward.local_addr();
    let client = std::thread::spawn(move || {
        let mut c = TcpStream::connect(host).unwrap();
        c.set_read_timeout(Some(DEADLINE)).unwrap();
        c.write_all(b"ping").unwrap();
        let mut answer = String::new();
        c.read_to_string(&mut answer).unwrap();
        answer
    });
    let mut iface = Interface::new(
        Config::new(HardwareAddress::Ethernet(EthernetAddress(GUEST_MAC))),
        &mut guest,
        smoltcp::time::Instant::now(),
    );
    iface.update_ip_addrs(|a| a.push(IpCidr::new(GUEST_V4.into(), PREFIX_V4)).unwrap());
    iface
        .routes_mut()
        .add_default_ipv4_route(GATEWAY_V4)
        .unwrap();
    let mut sockets = SocketSet::new(Vec::new());
    let mut server = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 4096]),
        tcp::SocketBuffer::new(vec![0; 4096]),
    );
    server.listen(8000).unwrap();
    let server = sockets.add(server);
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    loop {
        iface.poll(smoltcp::time::Instant::now(), &mut guest, &mut sockets);
        let s = sockets.get_mut::<tcp::Socket>(server);
        if s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        if got == b"ping" && s.can_send() {
            s.send_slice(b"hello from the guest").unwrap();
            s.close();
            got.clear();
        }
        if client.is_finished() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the forwarded connection did not complete"
        );
        guest.wait_interrupt(Duration::from_millis(20));
    }
    assert_eq!(client.join().unwrap(), "hello from the guest");
    let flows = network.flows().records();
    assert!(
        flows.iter().any(|f| f.dst.port() == 8000),
        "the forwarded flow is logged: {flows:?}"
    );
    let _in = rt.enter();
    drop(network);
}
