//! The scripts read the ids the daemon makes (`MessageId::placed`) as it writes
//! them: `placed_score` in the prelude against `message::placed_score`, in Redis.

/// The scripts read the score an id names (`placed_score` in the prelude) as
/// `message::placed_score` does, for ids of that shape and of any other.
#[test]
fn the_scripts_read_the_score_an_id_names_as_the_daemon_writes_it() {
    use proptest::prelude::*;
    let (_redis, conn, sha) = super::scripts::prelude_lab("return placed_score(ARGV[1]) or -1");
    let ids = prop_oneof![
        "d[0-9a-fA-F]{12}[0-9A-Z]{16}",
        "d[0-9a-zA-Z:._-]{28}",
        "[dD][-+x0-9a-f ]{11,13}[0-9A-Z]{16}",
        "[A-Za-z0-9._:-]{1,40}",
    ];
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&ids, |id| {
            let read: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(0)
                .arg(&id)
                .query(&mut *conn.borrow_mut())
                .unwrap();
            let want = crate::message::placed_score(&id).map_or(-1, |s| s as i64);
            prop_assert_eq!(read, want, "{}", id);
            Ok(())
        })
        .unwrap();
    // Priority 4 of 0-9 is 5 in the score's last digit (higher first).
    let id = crate::message::MessageId::placed(1_800_000_000_000, 4, 16).unwrap();
    let read: i64 = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(0)
        .arg(id.as_str())
        .query(&mut *conn.borrow_mut())
        .unwrap();
    assert_eq!(read, 18_000_000_000_005, "{}", id.as_str());
}
