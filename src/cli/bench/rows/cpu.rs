//! What a row's work cost in CPU: Redis's, the process's beside it, the script
//! calls Redis ran, and the bench's own where it made the load.

use serde::{Deserialize, Serialize};

/// CPU µs per message: Redis's, and the process's that did the work beside it
/// (none for the ceiling, whose work is all in Redis).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cpu {
    pub redis: f64,
    #[serde(flatten)]
    pub process: Option<ProcessCpu>,
    /// Script calls Redis ran meanwhile (absent in results from before it was
    /// measured, and for Redis Cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripts: Option<ScriptCalls>,
    /// The bench process's own CPU a message where it made the load on this
    /// machine (the single pushes: its pushers, and its Redis probe), which it
    /// takes from what delayq and Redis can use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<f64>,
}

/// Script calls (`EVAL`, `EVALSHA`, `FCALL`) Redis ran during a phase, whoever made
/// them (delayq, the bench's producer, BullMQ, the ceiling's loop): how many a
/// message, and Redis's µs in each, its nested commands included (`INFO
/// commandstats`). At a steady rate a call's own cost is paid message by message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScriptCalls {
    pub per_message: f64,
    pub us_each: f64,
    /// Of `us_each`: every other command's µs a call (the nested commands, and
    /// delayq's few direct ones: an upper bound of the nested ones).
    #[serde(default)]
    pub us_commands: f64,
    /// Of `us_each`: the rest, spent in Lua and calling from it.
    #[serde(default)]
    pub us_rest: f64,
}

/// The worker's CPU, keyed by whose it is; null when it could not be measured
/// (the failover's two daemons).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessCpu {
    Delayq(Option<f64>),
    Worker(Option<f64>),
}

impl Cpu {
    pub fn process_us(&self) -> Option<f64> {
        match self.process {
            Some(ProcessCpu::Delayq(us) | ProcessCpu::Worker(us)) => us,
            None => None,
        }
    }
}
