//! The Redis a configuration names, as an operator reads it.

use super::RedisConfig;

impl RedisConfig {
    /// Where delayq finds Redis, as a log line shows it: the Sentinels and the
    /// master's name, the Cluster's seed nodes, or the URL (redacted).
    pub fn describe(&self) -> String {
        let nodes = |nodes: &[(String, u16)]| {
            nodes
                .iter()
                .map(|(host, port)| format!("{host}:{port}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        match (&self.sentinel, &self.cluster) {
            (Some(s), _) => format!("master {} via sentinels {}", s.master, nodes(&s.nodes)),
            (None, Some(seeds)) => format!("cluster via {}", nodes(seeds)),
            (None, None) => self.url.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn the_redis_a_configuration_names_is_what_the_start_shows() {
        for (redis, shown) in [
            (
                "url = \"redis://:pw@10.0.0.5:6380/2\"",
                "redis://:<redacted>@10.0.0.5:6380/2",
            ),
            (
                "sentinel = { master = \"main\", nodes = [\"10.0.0.1:26379\", \"10.0.0.2:26379\"] }",
                "master main via sentinels 10.0.0.1:26379,10.0.0.2:26379",
            ),
            (
                "mode = \"cluster\"\nurl = \"redis://10.0.0.7:7000\"\nnodes = [\"10.0.0.8:7001\"]",
                "cluster via 10.0.0.7:7000,10.0.0.8:7001",
            ),
        ] {
            let config = Config::from_toml(&format!("[redis]\n{redis}\n"), std::iter::empty())
                .unwrap_or_else(|e| panic!("{redis}: {e}"));
            assert_eq!(config.redis.describe(), shown, "{redis}");
        }
    }
}
