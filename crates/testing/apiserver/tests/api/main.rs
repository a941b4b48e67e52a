//! The test API server against the real kube-rs client and watcher (and, for exact wire
//! shapes, a raw HTTP/1.1 client). One test binary, so kube is linked once.

mod client;
mod common;
mod faults;
mod watching;
mod wire;
