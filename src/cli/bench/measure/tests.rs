use super::*;
use proptest::prelude::*;

const INFO: &str = "# Commandstats\r\n\
    cmdstat_fcall:calls=18357,usec=3138062,usec_per_call=170.95,rejected_calls=0,failed_calls=0\r\n\
    cmdstat_hset:calls=30192,usec=60543,usec_per_call=2.01,rejected_calls=0,failed_calls=0\r\n\
    cmdstat_evalsha:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n\
    cmdstat_eval_ro:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n\
    cmdstat_function|load:calls=1,usec=4250,usec_per_call=4250.00,rejected_calls=0,failed_calls=0\r\n";

fn totals(calls: u64, usec: u64, other_usec: u64) -> ScriptTotals {
    ScriptTotals {
        calls,
        usec,
        other_usec,
    }
}

#[test]
fn script_calls_are_summed_from_commandstats() {
    // hset counts as another command; loading the library does not.
    assert_eq!(scripts_in(INFO), totals(18_361, 3_138_097, 60_543));
    assert_eq!(scripts_in(""), totals(0, 0, 0));
    assert_eq!(
        scripts_in("cmdstat_fcall:calls=x,usec=\ncmdstat_fcall"),
        totals(0, 0, 0)
    );
    assert_eq!(
        scripts_in(
            "cmdstat_info:calls=3,usec=90\ncmdstat_config|resetstat:calls=1,usec=9\ncmdstat_ping:calls=1,usec=1\ncmdstat_xadd:calls=2,usec=12"
        ),
        totals(0, 0, 12)
    );
}

#[test]
fn script_calls_per_message_and_each() {
    let calls = |start: (u64, u64), end: (u64, u64), n| {
        script_calls(totals(start.0, start.1, 0), totals(end.0, end.1, 0), n)
            .map(|s| (s.per_message, s.us_each))
    };
    assert_eq!(calls((10, 100), (30, 1100), 10), Some((2.0, 50.0)));
    assert_eq!(calls((0, 0), (1, 3), 3), Some((0.333, 3.0)));
    // Two batch calls for a thousand messages are not rounded away.
    assert_eq!(calls((0, 0), (2, 63_880), 1000), Some((0.002, 31_940.0)));
    assert_eq!(calls((0, 0), (2143, 1), 1000), Some((2.14, 0.0)));
    assert_eq!(calls((0, 0), (18_357, 1), 10), Some((1840.0, 0.0)));
    // None run, or the stats reset meanwhile.
    assert_eq!(calls((10, 100), (10, 100), 10), None);
    assert_eq!(calls((10, 100), (5, 50), 10), None);
    // No message: per call still, per message against one.
    assert_eq!(calls((0, 0), (4, 8), 0), Some((4.0, 2.0)));
}

/// A call's µs split into the other commands' and the rest; other commands'
/// µs beyond the scripts' (delayq's direct ones) never make the rest negative.
#[test]
fn a_call_is_split_into_commands_and_the_rest() {
    let split = |end: ScriptTotals| {
        script_calls(totals(0, 0, 0), end, 100).map(|s| (s.us_each, s.us_commands, s.us_rest))
    };
    assert_eq!(split(totals(100, 10_000, 2_000)), Some((100.0, 20.0, 80.0)));
    assert_eq!(split(totals(100, 1_000, 5_000)), Some((10.0, 10.0, 0.0)));
    assert_eq!(split(totals(3, 100, 1)), Some((33.3, 0.3, 33.0)));
}

proptest! {
    #[test]
    fn calls_a_message_are_never_rounded_away(calls in 1u64..10_000_000, messages in 1u64..100_000_000) {
        let exact = calls as f64 / messages as f64;
        let got = script_calls(totals(0, 0, 0), totals(calls, 0, 0), messages).expect("calls").per_message;
        prop_assert!(got > 0.0 && (got - exact).abs() <= exact * 0.005, "{got} for {exact}");
    }

    #[test]
    fn any_text_is_read_without_panicking(text in any::<String>()) {
        let _ = scripts_in(&text);
    }

    #[test]
    fn script_lines_add_up_and_others_count_nothing(
        lines in proptest::collection::vec(
            (prop::sample::select(vec!["fcall", "evalsha", "eval", "fcall_ro", "evalsha_ro", "eval_ro", "hset", "xadd", "function|load"]),
             0u64..1_000_000, 0u64..1_000_000_000),
            0..20,
        )
    ) {
        let text: String = lines
            .iter()
            .map(|(name, calls, usec)| format!("cmdstat_{name}:calls={calls},usec={usec},usec_per_call=1.00\r\n"))
            .collect();
        let script = |name: &str| !matches!(name, "hset" | "xadd" | "function|load");
        let expected = lines.iter().filter(|(n, ..)| script(n)).fold((0, 0), |(c, u), (_, calls, usec)| (c + calls, u + usec));
        let other: u64 = lines.iter().filter(|(n, ..)| matches!(*n, "hset" | "xadd")).map(|(_, _, usec)| usec).sum();
        prop_assert_eq!(scripts_in(&text), totals(expected.0, expected.1, other));
    }

    /// Any `/proc/stat` first line of eight or more counts reads back; the
    /// stolen share between two readings stays within 0–100%.
    #[test]
    fn host_cpu_reads_any_counts(
        a in proptest::collection::vec(0u64..1 << 40, 8..11),
        grow in proptest::collection::vec(0u64..1 << 20, 8),
    ) {
        let line = |t: &[u64]| format!("cpu  {}\ncpu0 1 2 3\n", t.iter().map(u64::to_string).collect::<Vec<_>>().join(" "));
        let first = HostCpu::parse(&line(&a)).unwrap();
        prop_assert_eq!(first.total, a[..8].iter().sum::<u64>());
        prop_assert_eq!(first.stolen, a[7]);
        let b: Vec<u64> = a.iter().zip(grow.iter().chain(std::iter::repeat(&0))).map(|(x, g)| x + g).collect();
        let share = first.stolen_until(HostCpu::parse(&line(&b)).unwrap());
        match share {
            None => prop_assert_eq!(grow.iter().sum::<u64>(), 0),
            Some(share) => prop_assert!((0.0..=100.0).contains(&share)),
        }
    }

    /// Whatever the text, reading it never panics.
    #[test]
    fn host_cpu_never_panics(text in ".{0,80}") {
        let _ = HostCpu::parse(&text);
    }
}

#[test]
fn host_cpu_reads_the_cpu_line_and_the_stolen_share() {
    let at = |line: &str| HostCpu::parse(line);
    let start = at("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18\n").unwrap();
    assert_eq!((start.total, start.stolen), (1000, 35));
    let later = at("cpu  400 0 100 1100 10 0 5 385 0 0").unwrap();
    // 1000 ticks passed, 350 of them stolen.
    assert_eq!(start.stolen_until(later), Some(35.0));
    assert_eq!(start.stolen_until(start), None, "no time passed");
    assert_eq!(later.stolen_until(start), None, "the counts went back");
    for bad in [
        "",
        "cpu0 1 2 3 4 5 6 7 8",
        "cpu 1 2 3 4 5 6 7",
        "cpu 1 2 3 x 5 6 7 8",
        "cpu -1 2 3 4 5 6 7 8",
        "intr 1 2 3 4 5 6 7 8",
    ] {
        assert_eq!(at(bad), None, "{bad:?}");
    }
    assert_eq!(
        at(&format!("cpu {} 1 0 0 0 0 0 0", u64::MAX)),
        None,
        "a total past u64"
    );
}
