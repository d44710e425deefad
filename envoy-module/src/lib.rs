//! # kvroute-envoy
//!
//! kvroute inside Envoy: an HTTP filter that Envoy 1.40 loads as a dynamic module
//! (`libkvroute_envoy.so`, `envoy.filters.http.dynamic_modules`), routing each request on
//! [`kvroute_core`] in Envoy's own worker threads, with no gRPC hop and no second process.
//! It reads requests, decides, rejects and names headers exactly as kvroute-ext-proc does
//! (both drive [`kvroute_ext_proc::routing`]), takes the same TOML configuration, and serves
//! the same `/metrics` and `/debug` pages from a thread of its own ([`instance`]).
//!
//! Modules: [`abi`] (the only unsafe code: Envoy's C ABI, its hooks and callbacks, panics
//! caught at the boundary) → [`filter`] (one stream's routing, safe, over the [`host`]
//! trait) → [`instance`] (the router shared by Envoy's workers, and the background thread);
//! [`balancer`] (kvroute as the pods' cluster's load-balancing policy: Envoy's hosts and their
//! health, [`fleet`]); [`log`].

#![warn(missing_docs, unreachable_pub)]

pub mod abi;
pub mod balancer;
pub mod filter;
pub mod fleet;
pub mod host;
pub mod instance;
pub mod log;
