//! Two shortcuts of the prelude give, in Redis, exactly what the longer forms they
//! replaced gave, so that nothing stored before them is read differently: an id's
//! hash (`record_hash`, which places it in the index's, the records' and the keys'
//! buckets) and an integer's text as a command takes it (`int_text`).

/// For ids of any bytes and length, `record_hash` is the first 32 bits of the id's
/// SHA-1 as the buckets were placed by before: its first eight hex digits parsed.
#[test]
fn an_ids_hash_is_its_sha1s_first_eight_hex_digits() {
    use proptest::prelude::*;
    let script = r#"
local out = {}
for i = 1, #ARGV do
  -- Twice: the second is the call's kept hash.
  local a, b = record_hash(ARGV[i]), record_hash(ARGV[i])
  local before = tonumber(string.sub(redis.sha1hex(ARGV[i]), 1, 8), 16)
  out[i] = (a == before and b == before) and 1 or 0
end
return out
"#;
    let (_redis, conn, sha) = super::prelude_lab(script);
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(
            &prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..40),
            |ids| {
                let same: Vec<i64> = redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(0)
                    .arg(&ids)
                    .query(&mut *conn.borrow_mut())
                    .unwrap();
                prop_assert_eq!(same, vec![1; ids.len()]);
                Ok(())
            },
        )
        .unwrap();
}

/// For every number (integers near and past 2^53 and 2^63, fractions, infinities and
/// NaN) and for strings, the text a command takes from `int_text(v)` is the text it
/// takes from `v` itself (`ECHO` answers what it took), also when the kept last text
/// is asked again.
#[test]
fn an_integers_text_is_the_text_redis_makes_of_it() {
    use proptest::prelude::*;
    let script = r#"
local out = {}
for i = 1, #ARGV do
  local v = tonumber(ARGV[i]) or ARGV[i]
  if ARGV[i] == 'nan' then v = 0 / 0 elseif ARGV[i] == 'inf' then v = 1 / 0 elseif ARGV[i] == '-inf' then v = -1 / 0 end
  local direct = redis.call('ECHO', v)
  out[#out + 1] = direct
  out[#out + 1] = redis.call('ECHO', int_text(v))
  out[#out + 1] = direct
  out[#out + 1] = redis.call('ECHO', int_text(v))
end
return out
"#;
    let (_redis, conn, sha) = super::prelude_lab(script);
    const EDGES: [&str; 17] = [
        "0",
        "1",
        "-1",
        "9007199254740991",
        "9007199254740992",
        "-9007199254740992",
        "9223372036854775807",
        "1e300",
        "0.5",
        "-2.25",
        "17650000000009",
        "nan",
        "inf",
        "-inf",
        "1",
        "x1",
        "",
    ];
    let values = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (-(1i64 << 53)..(1i64 << 53)).prop_map(|v| v.to_string()),
        (1_700_000_000_000u64..1_900_000_000_000).prop_map(|ms| (ms * 10 + 9).to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        prop::sample::select(&EDGES[..]).prop_map(str::to_owned),
        "[a-z0-9.]{0,8}",
    ];
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&prop::collection::vec(values, 1..30), |values| {
            let out: Vec<Vec<u8>> = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(0)
                .arg(&values)
                .query(&mut *conn.borrow_mut())
                .unwrap();
            for (i, pair) in out.chunks(2).enumerate() {
                prop_assert_eq!(&pair[0], &pair[1], "{}", values[i / 2]);
            }
            Ok(())
        })
        .unwrap();
    // The edges all at once, in order: each beside the one before it.
    let out: Vec<Vec<u8>> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(0)
        .arg(&EDGES[..])
        .query(&mut *conn.borrow_mut())
        .unwrap();
    assert_eq!(out.len(), 4 * EDGES.len());
    for pair in out.chunks(2) {
        assert_eq!(pair[0], pair[1]);
    }
}
