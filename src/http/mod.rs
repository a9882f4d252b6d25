//! The HTTP API: hyper 1.x (HTTP/1.1, keep-alive) on every shard.
//!
//! Which cores: every shard. Each shard listens on the same port through its own
//! `SO_REUSEPORT` socket, so the kernel spreads connections over the shards and a
//! request is served, start to finish, on the core that accepted its connection:
//! no connection, request or response ever crosses cores. A request that needs
//! another shard's partition (later slices) sends that shard a message; it never
//! moves the connection.
//!
//! What is shared between cores, and why it is not on the per-message path, is in
//! [`node`]: two flags (ready, stopping) and the node-wide connection count that
//! `http.max_connections` limits.
//!
//! Map:
//! - [`server`]: one shard's accept loop, its connections, and their two-phase
//!   drain when the node stops.
//! - [`routes`]: the route table and the pipeline every request passes through
//!   (stopping, 404/405, 415, endpoint); `/healthz` and `/readyz`.
//! - [`router`]: pattern matching of method and path, with path parameters.
//! - [`response`]: the reference's response conventions (JSON errors, plain-text
//!   404/405, 503 while stopping), the 415 guard and the capped body reader (413).
//! - [`topics`], [`produce`], [`consume`], [`replay`]: the `/v1` handlers.
//! - [`produce_input`]: decoding a produce request (query string, payload size,
//!   the batch document and its compression) into checked values; no I/O.
//! - [`node`]: the node-wide state the shards share.
//!
//! The glue that lets hyper run on glommio (socket adapter, timer) is in
//! `narad_io::net`.

pub mod consume;
pub mod node;
pub mod produce;
pub mod produce_input;
pub mod replay;
pub mod response;
pub mod router;
pub mod routes;
pub mod server;
pub mod topics;

pub use node::NodeState;
pub use server::{HttpSettings, ShardServer};

/// A query parameter's number: decimal digits only, no sign, no spaces, and in
/// range of `T`. Every route reads `partition`, `offset` and `max` this way, so
/// `+1` or ` 1` is refused alike everywhere rather than accepted by some.
pub fn decimal<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The client, as the server puts it in every request's extensions: its
/// address (the identity of per-identity caps while security is off), and
/// whether it has stopped sending.
#[derive(Clone, Debug)]
pub struct Peer {
    pub addr: Option<std::net::IpAddr>,
    pub end: narad_io::net::PeerEnd,
}

/// The identity per-identity caps count a request against: its client address
/// (security is off); loopback for requests without one (in-process tests).
pub fn identity_of<B>(request: &hyper::Request<B>) -> std::net::IpAddr {
    request
        .extensions()
        .get::<Peer>()
        .and_then(|p| p.addr)
        .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]))
}

/// Says when the request's client stops sending; `None` for requests that
/// came from no connection (in-process tests).
pub fn peer_end_of<B>(request: &hyper::Request<B>) -> Option<narad_io::net::PeerEnd> {
    request.extensions().get::<Peer>().map(|p| p.end.clone())
}
