//! Error types. Model errors come from the pure core (bad topology, bad
//! parameter); lab errors from applying a plan to the kernel.

use std::io;

/// A problem with a topology, a scenario or a parameter. Every variant names
/// the item at fault so that the message can be acted upon.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{item}: '{value}' is not valid: expected {expected}")]
    BadValue {
        item: String,
        value: String,
        expected: String,
    },
    #[error("{item} = {value} is out of range: must be {range}")]
    OutOfRange { item: String, value: String, range: String },
    #[error("unknown topology '{0}': choose one of pair, star, linear, chain, fattree, custom")]
    UnknownTopology(String),
    #[error("topology '{topo}' needs '{param}': {hint}")]
    MissingParam { topo: String, param: String, hint: String },
    #[error("duplicate node name '{0}': every host, switch and router needs its own name")]
    DuplicateNode(String),
    #[error("bad node name '{0}': use 1-24 letters, digits or '_', starting with a letter")]
    BadName(String),
    #[error("bad switch name '{name}': {rule}")]
    BadSwitchName { name: String, rule: &'static str },
    #[error("link {index} ({a} - {b}) names unknown node '{missing}'")]
    UnknownNode {
        index: usize,
        a: String,
        b: String,
        missing: String,
    },
    #[error("link {index} connects '{node}' to itself")]
    SelfLink { index: usize, node: String },
    #[error("switches {0} form a loop: Linux bridges here run without STP, so a switch loop would flood forever; use routers for redundant paths")]
    SwitchLoop(String),
    #[error("host '{0}' has more than one link to the same layer-2 segment")]
    HostTwiceOnSegment(String),
    #[error("command {index}: unknown host '{host}'")]
    CommandHost { index: usize, host: String },
    #[error("scenario file {path}: {msg}")]
    Scenario { path: String, msg: String },
    #[error("{item}: {node} has no device '{dev}' in the plan ({known})")]
    UnknownDevice {
        item: String,
        node: String,
        dev: String,
        known: String,
    },
    #[error("address space exhausted: the topology needs more than 10.0.0.0/8")]
    AddressSpace,
}

/// A problem while building, running or removing a lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root or in a privileged container): this process lacks {missing}")]
    MissingCaps { missing: String },
    #[error("`{cmd}` failed (exit {code}): {stderr}")]
    Command { cmd: String, code: String, stderr: String },
    /// An operation netlab does in-process (a device's sysfs setting).
    #[error("`{op}` failed: {msg}")]
    Apply { op: String, msg: String },
    #[error("could not start `{cmd}`: {source}")]
    Spawn { cmd: String, source: io::Error },
    #[error("{call} failed: {source}")]
    Sys { call: String, source: io::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("command in host '{host}' failed (exit {code}): {cmd}{tail}")]
    HostCommand {
        host: String,
        cmd: String,
        code: String,
        tail: String,
    },
    #[error("no lab is up{0}: start one with `netlab up SCENARIO`")]
    NoLab(String),
    #[error("{0}")]
    Ambiguous(String),
    #[error("unknown host '{host}' in run {run}: hosts are {known}")]
    UnknownHost { host: String, run: String, known: String },
    #[error("delay line for link {link}: {msg}")]
    DelayLine { link: String, msg: String },
    #[error("interrupted: lab removed")]
    Interrupted,
    #[error("virtual time: {0}")]
    Clock(#[from] vtime::Error),
    #[error("virtual time needs the lab's owner alive (its clock record goes with it): use `netlab run` (or a program that holds the lab) for --tdf > 1, not `netlab up`")]
    DetachedClock,
    #[error("run {run} is in use by live process {pid} (a `netlab run`, a test or the demo, which removes it when done); stop that process, or use --force")]
    InUse { run: String, pid: i32 },
    #[error("link backend '{name}' is unsupported here: {reason}")]
    Unsupported { name: String, reason: String },
    #[error("monitor port: {0}")]
    Monitor(String),
}

impl LabError {
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        LabError::Io {
            what: what.into(),
            source,
        }
    }
    pub fn sys(call: impl Into<String>, source: impl Into<io::Error>) -> Self {
        LabError::Sys {
            call: call.into(),
            source: source.into(),
        }
    }
}

impl From<oskit::SysError> for LabError {
    fn from(e: oskit::SysError) -> Self {
        LabError::Sys {
            call: e.call,
            source: e.source,
        }
    }
}
