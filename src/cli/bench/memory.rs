//! Redis's memory for data, as a scenario reads it before and after its messages.

use anyhow::Context;
use redis::aio::MultiplexedConnection;

use delayq_client::store::info_value;

/// Redis's memory for data: `used_memory` less what its clients hold at that
/// instant. Clients' buffers grow and shrink with the loads, scrapes and leaders'
/// calls around a measurement and, at a small scale, would be counted as (or
/// against) the data; `INFO`'s own `mem_clients_normal` lags (Redis refreshes it in
/// its clients cron), so a leader's query buffer of a few hundred kilobytes that the
/// cron had not seen yet once made 2,000 records weigh less than nothing. Each
/// client's `tot-mem` in `CLIENT LIST` is computed when asked, and one `MULTI` makes
/// both readings of one instant.
/// The slow log is emptied first: each entry keeps up to 32 of a slow command's
/// arguments (a forward call's, past 10 ms on a loaded machine), up to 128 entries
/// that no flush clears, and their hundreds of kilobytes came and went between two
/// readings of a 2,000-message burst.
pub async fn used_memory(conn: &mut MultiplexedConnection) -> anyhow::Result<f64> {
    let (clients, info): (String, String) = redis::pipe()
        .atomic()
        .cmd("SLOWLOG")
        .arg("RESET")
        .ignore()
        .cmd("CLIENT")
        .arg("LIST")
        .cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await?;
    let used: f64 = info_value(&info, "used_memory")
        .context("INFO memory has no used_memory")?
        .parse()?;
    Ok(used - clients_memory(&clients)?)
}

/// The sum of every client's `tot-mem` in a `CLIENT LIST` reply.
fn clients_memory(list: &str) -> anyhow::Result<f64> {
    list.lines()
        .filter(|line| !line.is_empty())
        .map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("tot-mem="))
                .with_context(|| format!("CLIENT LIST has no tot-mem: {line}"))?
                .parse::<f64>()
                .with_context(|| format!("CLIENT LIST's tot-mem: {line}"))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_client_s_memory_is_summed() {
        let list = "id=3 addr=127.0.0.1:5 laddr=127.0.0.1:6 fd=8 name= age=1 qbuf=0 tot-mem=22400 rbs=1024 resp=2\n\
                    id=4 addr=127.0.0.1:7 fd=9 name=leader tot-mem=185000 resp=3\n";
        assert_eq!(clients_memory(list).unwrap(), 207_400.0);
        assert_eq!(clients_memory("").unwrap(), 0.0);
    }

    #[test]
    fn a_list_without_tot_mem_is_refused() {
        let err = clients_memory("id=3 addr=127.0.0.1:5 qbuf=0\n").unwrap_err();
        assert!(err.to_string().contains("no tot-mem"), "{err}");
        assert!(clients_memory("id=3 tot-mem=lots\n").is_err());
    }

    proptest! {
        #[test]
        fn any_text_is_read_without_panicking(text in any::<String>()) {
            let _ = clients_memory(&text);
        }
    }
}
