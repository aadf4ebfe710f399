//! What wakes the vsock device outside guest notifications: host sockets.
//!
//! The device thread's event loop watches the device's own epoll fd; when it fires, the
//! device drains its host-socket events and moves data into the guest's rx queue.

use std::os::fd::AsRawFd;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::Vsock;

impl MutEventSubscriber for Vsock {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.muxer.epoll.as_raw_fd() {
            self.handle_host_events();
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.muxer.epoll, EventSet::IN)) {
            tracing::error!(error = ?e, "vsock: cannot register with the event loop");
        }
    }
}
