//! `delayq functions`: lists the function libraries of delayq that Redis holds
//! and removes those of other versions. Each version loads a library of its own
//! (about 370 KB of Lua memory and 130 KB of function memory), and an upgrade
//! leaves the old one loaded: the daemon cannot tell when no node runs the old
//! version any more, so the operator prunes once every node runs the new one.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use delayq_client::config::Config;
use delayq_client::store::{NodeLibraries, Store};

#[derive(Args, Debug)]
pub struct FunctionsArgs {
    /// Config file of the deployment (its Redis); without it, defaults plus
    /// DELAYQ_* environment overrides.
    #[arg(long, short, env = "DELAYQ_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    action: FunctionsAction,
}

#[derive(Subcommand, Debug)]
enum FunctionsAction {
    /// List delayq's libraries on each Redis master, this version's marked, and
    /// the memory function libraries take there.
    List,
    /// Remove the libraries of other versions of delayq. Safe at any time: a
    /// node still running another version loads its library again at its next
    /// call (so prune once every node runs this version).
    Prune {
        /// Remove this version's library too (nodes running it load it again at
        /// their next call; for a Redis that delayq leaves for good, say).
        #[arg(long)]
        all: bool,
        /// Only say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub async fn main(args: FunctionsArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref()).context("read the configuration")?;
    let store = Store::connect(&config.store_config())
        .await
        .with_context(|| format!("connect to {}", config.redis_target()))?;
    let before = store
        .function_libraries()
        .await
        .context("list the function libraries")?;
    match args.action {
        FunctionsAction::List => {
            println!("this version's library: {}", Store::library_name());
            for node in &before {
                print_node(node);
            }
            Ok(())
        }
        FunctionsAction::Prune { all, dry_run } => {
            let doomed: Vec<_> = before
                .iter()
                .flat_map(|node| {
                    let of_node = node.libraries.iter().filter(|l| all || !l.current);
                    of_node.map(move |library| (node, library))
                })
                .collect();
            if dry_run {
                for (node, library) in &doomed {
                    println!("would remove {}{}", library.name, at(node));
                }
                println!(
                    "{} would be removed (--dry-run: nothing removed)",
                    libraries(doomed.len())
                );
                return Ok(());
            }
            let mut removed = 0;
            for (node, library) in doomed {
                let gone = store
                    .delete_library(node.node.as_deref(), &library.name)
                    .await
                    .with_context(|| format!("remove {}{}", library.name, at(node)))?;
                if gone {
                    removed += 1;
                    println!("removed {}{}", library.name, at(node));
                }
            }
            println!("{} removed", libraries(removed));
            let after = store
                .function_libraries()
                .await
                .context("list the function libraries")?;
            for node in &after {
                print_node(node);
            }
            Ok(())
        }
    }
}

/// "1 library", "3 libraries".
fn libraries(n: usize) -> String {
    format!("{n} librar{}", if n == 1 { "y" } else { "ies" })
}

/// " on host:port" on Redis Cluster, else nothing.
fn at(node: &NodeLibraries) -> String {
    node.node
        .as_deref()
        .map(|n| format!(" on {n}"))
        .unwrap_or_default()
}

fn print_node(node: &NodeLibraries) {
    println!(
        "{}: {} of delayq's, function memory {} KiB Lua + {} KiB",
        node.node.as_deref().unwrap_or("redis"),
        match node.libraries.len() {
            0 => "no library".to_owned(),
            n => libraries(n),
        },
        node.lua_bytes.div_ceil(1024),
        node.bytes.div_ceil(1024),
    );
    for library in &node.libraries {
        println!(
            "  {}  {} function{}{}",
            library.name,
            library.functions,
            if library.functions == 1 { "" } else { "s" },
            if library.current {
                "  (this version)"
            } else {
                "  (another version)"
            }
        );
    }
}
