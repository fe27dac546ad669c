//! The journal on a real MariaDB:
//!
//! - `schema`: `delayq journal migrate`, the schema and its migrations;
//! - `daemon`: the daemon with its journal on, through Redis and MySQL failures;
//! - `deadlock`: a transaction ended as a deadlock's victim, run again;
//! - `history`: a message's journey in the transition log;
//! - `keys`: business keys through a loss of Redis's data;
//! - `marker`: the journal's marker through a restore and a second loss;
//! - `schedules`: recurring schedules through a loss of Redis's data.

mod daemon;
mod deadlock;
mod history;
mod keys;
mod marker;
mod schedules;
mod schema;
