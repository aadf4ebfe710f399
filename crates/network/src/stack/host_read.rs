//! A host connection's bytes read straight into the smoltcp socket that carries them to the
//! guest, by the stack itself.
//!
//! The first relay read each chunk in a task of its own (into a fresh buffer), passed it over
//! a channel and woke the stack, which copied it into smoltcp's buffer: per 32 KiB of a
//! download, an allocation, an extra copy and a hand-off between threads. Here a small task
//! only waits for the socket to become readable and wakes the stack; the stack reads with
//! `try_read` into the free part of smoltcp's send buffer until the host has nothing more
//! (then it re-arms the task) or the buffer is full (then it reads again on a later pass, as
//! the guest's acknowledgements free room, which is also the back-pressure on the host).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use smoltcp::socket::tcp;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// The read side of a host connection, shared by the stack and its waiting task.
pub(super) struct HostRead {
    half: Arc<OwnedReadHalf>,
    /// Set by the task when the socket is readable; cleared by the stack when a read would
    /// block.
    ready: Arc<AtomicBool>,
    /// Tells the task to wait for readability again.
    rearm: Arc<Notify>,
}

/// What one [`HostRead::fill`] did.
pub(super) enum Filled {
    /// Moved this many bytes (possibly none) and may move more later.
    Bytes(usize),
    /// Moved this many bytes, then the host closed (or reset) its side.
    Eof(usize),
}

impl HostRead {
    /// Starts waiting for `half` to become readable; the task's handle is for the flow to
    /// abort.
    pub fn start(half: OwnedReadHalf, wake: &Arc<Notify>) -> (Self, AbortHandle) {
        let this = Self {
            half: Arc::new(half),
            ready: Arc::new(AtomicBool::new(false)),
            rearm: Arc::new(Notify::new()),
        };
        let (half, ready, rearm, wake) = (
            this.half.clone(),
            this.ready.clone(),
            this.rearm.clone(),
            wake.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                // An error is readable too: the stack's read returns it.
                let _ = half.readable().await;
                ready.store(true, Ordering::Release);
                wake.notify_one();
                rearm.notified().await;
            }
        });
        (this, task.abort_handle())
    }

    /// The host connection.
    pub fn stream(&self) -> &tokio::net::TcpStream {
        (*self.half).as_ref()
    }

    /// Reads what the host has into `socket`'s send buffer, as far as it has room.
    pub fn fill(&self, socket: &mut tcp::Socket) -> Filled {
        let mut moved = 0;
        if !self.ready.load(Ordering::Acquire) {
            return Filled::Bytes(0);
        }
        // A full buffer would hand `try_read` an empty slice, whose 0 reads as end of file.
        while socket.can_send() {
            let read = socket.send(|room| match self.half.try_read(room) {
                Ok(n) => (n, Ok(n)),
                Err(e) => (0, Err(e)),
            });
            match read {
                Ok(Ok(0)) => return Filled::Eof(moved),
                Ok(Ok(n)) => moved += n,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.ready.store(false, Ordering::Release);
                    self.rearm.notify_one();
                    break;
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Reset: the guest's side is closed as at the end of the data.
                Ok(Err(_)) => return Filled::Eof(moved),
                Err(_) => break, // the socket may not send (any more)
            }
        }
        Filled::Bytes(moved)
    }
}
