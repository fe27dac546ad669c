//! Validation of `[election]`: the mode, and the groups of `per_shard` (each an etcd
//! election, so it needs `[etcd]`), at most one per shard.

use super::*;

/// `[election]`: the mode, and the groups of `per_shard` (each an etcd election,
/// so it needs `[etcd]`), at most one per shard.
pub(super) fn election_config(
    raw: RawElection,
    shards: u16,
    etcd: bool,
) -> Result<ElectionConfig, ConfigError> {
    let RawElection { mode, groups } = raw;
    match mode.as_str() {
        "single" => Ok(ElectionConfig {
            groups: 1,
            per_shard: false,
        }),
        "per_shard" => {
            if !etcd {
                return Err(invalid(
                    "election.mode",
                    "\"per_shard\" needs etcd.endpoints: each group is an etcd election",
                ));
            }
            let groups = match groups {
                Some(n) => positive("election.groups", n, i64::from(shards)).map_err(|_| {
                    invalid(
                        "election.groups",
                        format!("must be 1 to redis.shards ({shards}) (got {n})"),
                    )
                })? as u16,
                None => shards.min(DEFAULT_GROUPS),
            };
            Ok(ElectionConfig {
                groups,
                per_shard: true,
            })
        }
        other => Err(invalid(
            "election.mode",
            format!("{other:?}: must be \"single\" or \"per_shard\""),
        )),
    }
}

/// `election.groups` unless set (or `redis.shards`, when fewer).
pub(super) const DEFAULT_GROUPS: u16 = 4;
