//! # kvroute-sim
//!
//! A deterministic discrete-event simulator of vLLM V1 replicas that routes every request with
//! the real [`kvroute_core::Router`], the seed study as a command, and the same engine model
//! served in real time as a fake vLLM server, with a study-shaped load client.
//!
//! Modules, one concept each:
//! - [`engine`]: one replica's scheduler, prefix cache, KV pool and step-time model;
//! - [`tokenizer`]: the deterministic tokenizer model;
//! - [`prompt_tokens`]: a prompt's token ids, from that model or a real tokenizer;
//! - [`workload`]: the study's scenarios and the JSONL trace format;
//! - [`cluster`]: the discrete-event loop (router + replicas + client);
//! - [`replicas`]: replicas of different speeds and capacities (`run --pod`);
//! - [`study`]: the study's phases and rounds;
//! - [`bar`]: issue 6's bar, a strategy against the study's three phase by phase;
//! - [`suite`]: other workloads, drawn for several seeds, every strategy on each;
//! - [`report`]: metrics, the study table and per-request records;
//! - [`router_file`]: router parameters from a kvroute TOML file (`run --router-config`);
//! - [`plot`]: the SVG plot of TTFT over time;
//! - [`serve`]: the fake vLLM HTTP server;
//! - [`replay`]: the load client for a live endpoint.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bar;
pub mod cli;
pub mod cluster;
pub mod cpu;
pub mod engine;
pub mod overload;
pub mod plot;
pub mod prompt_tokens;
pub mod replay;
pub mod replicas;
pub mod report;
pub mod router_file;
pub mod serve;
pub mod study;
pub mod suite;
pub mod tokenizer;
pub mod workload;
