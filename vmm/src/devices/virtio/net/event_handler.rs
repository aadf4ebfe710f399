//! What wakes the net device outside guest notifications: the frame socket.
//!
//! The device thread's event loop watches the device's own epoll fd (listener and peer);
//! when it fires, the device accepts, notices hang-ups and moves frames.

use std::os::fd::AsRawFd;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::Net;

impl MutEventSubscriber for Net {
    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.frames.epoll.as_raw_fd() {
            self.handle_host_events();
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.frames.epoll, EventSet::IN)) {
            tracing::error!(error = ?e, "net: cannot register with the event loop");
        }
    }
}
