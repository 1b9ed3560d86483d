//! netlab: an emulated network on one machine.
//!
//! Hosts and routers are network namespaces, switches are Linux bridges,
//! links are veth pairs shaped with HTB and delayed by netem or, where the
//! kernel has no netem, by our own delay line. A topology is data
//! ([`model`]), turned into a plan of ip/tc/sysctl operations ([`plan`])
//! that is applied checking every exit status ([`apply`]) and always removed
//! again ([`lab`]).
#![deny(unsafe_code)]

pub mod adapt;
pub mod addr;
pub mod apply;
pub mod delayline;
pub mod error;
pub mod lab;
pub mod log;
pub mod model;
pub mod monitor;
pub mod netns;
pub mod plan;
pub mod probe;
pub mod runner;
pub mod scenario;
mod sys;
pub mod topo;
pub mod units;

pub use error::{LabError, ModelError};
