//! Virtio devices on the virtio-mmio transport.
