//! A native NRI plugin client over the generated bindings of
//! `dra_cpu_proto::nri`:
//!
//! - [`mux`]: the connection multiplexer NRI runs over its Unix socket.
//! - [`events`]: event masks and the `StateChange` mapping.
//! - [`plugin`]: the [`plugin::NriPlugin`] trait and the ttrpc service around it.
//! - [`client`]: connect, register, update, reconnect.

pub mod client;
pub mod events;
pub mod mux;
pub mod plugin;
