//! A new message's body, made around its packed fields without an array of the
//! whole (`encode_body`, `compact_elem` in the prelude), is the same bytes as the
//! body made from its fields one by one, in Redis.

/// For messages of every optional shape (key, expiry, redelivery, priority, fields
/// of any count), the packed path and the whole-array path of the prelude give the
/// same body and the same compact element, and the body reads back as written.
#[test]
fn a_packed_body_is_the_same_bytes_as_one_packed_whole() {
    use proptest::prelude::*;
    // ARGV: stream, packed fields, priority, created, attempt, expire_at, key,
    // first_delivered, reason ("" = not set), score, id.
    let script = r#"
local function opt(v) if v == '' then return nil end return v end
local function num(v) if v == '' then return nil end return tonumber(v) end
local function msg_of(packed)
  local m = { stream = ARGV[1], priority = tonumber(ARGV[3]), created = tonumber(ARGV[4]),
    attempt = tonumber(ARGV[5]), expire_at = tonumber(ARGV[6]), key = opt(ARGV[7]),
    first_delivered = num(ARGV[8]), reason = opt(ARGV[9]), due = tonumber(ARGV[10]) / 10 }
  if packed then m.packed_fields = ARGV[2] else m.fields = cmsgpack.unpack(ARGV[2]) end
  return m
end
local score, id = tonumber(ARGV[10]), ARGV[11]
local packed, whole = msg_of(true), msg_of(false)
-- Twice each, so that the packers' kept bytes are used as well as made.
local out = {}
for _ = 1, 2 do
  out[#out + 1] = encode_body(packed)
  out[#out + 1] = encode_body(whole)
  out[#out + 1] = compact_elem(score, id, packed)
  out[#out + 1] = score_bytes(score) .. string.char(#id) .. id .. compact_body(whole)
end
local read = decode_body(encode_body(packed))
out[#out + 1] = cmsgpack.pack(read.fields)
return out
"#;
    let (_redis, conn, sha) = super::scripts::prelude_lab(script);
    let optional = |s: &'static str| prop_oneof![Just(String::new()), s];
    let message = (
        "[a-z:]{1,12}",
        prop::collection::vec(("[a-z]{1,6}", ".{0,40}"), 1..20),
        0u8..=9,
        (1_700_000_000_000u64..1_900_000_000_000, 1u32..5, 0u64..2),
        (
            optional("[a-z0-9-]{1,20}"),
            optional("1[0-9]{12}"),
            optional("[a-z ]{1,20}"),
        ),
        "[A-Za-z0-9._:-]{1,40}",
    );
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(
            &message,
            |(stream, fields, priority, (created, attempt, ttl), (key, first, reason), id)| {
                let flat: Vec<&str> = fields
                    .iter()
                    .flat_map(|(f, v)| [f.as_str(), v.as_str()])
                    .collect();
                let mut packed = Vec::new();
                rmp::encode::write_array_len(&mut packed, flat.len() as u32).unwrap();
                for s in &flat {
                    rmp::encode::write_str(&mut packed, s).unwrap();
                }
                let score = (created + 60_000) * 10 + 9 - u64::from(priority);
                let expire_at = if ttl == 1 { created + 120_000 } else { 0 };
                let out: Vec<Vec<u8>> = redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(0)
                    .arg(&stream)
                    .arg(&packed)
                    .arg(priority)
                    .arg(created)
                    .arg(attempt)
                    .arg(expire_at)
                    .arg(&key)
                    .arg(&first)
                    .arg(&reason)
                    .arg(score)
                    .arg(&id)
                    .query(&mut *conn.borrow_mut())
                    .unwrap();
                for pair in out[..8].chunks(2) {
                    prop_assert_eq!(&pair[0], &pair[1]);
                }
                prop_assert_eq!(&out[0], &out[4]);
                prop_assert_eq!(&out[2], &out[6]);
                prop_assert_eq!(&out[8], &packed, "the fields read back as packed");
                Ok(())
            },
        )
        .unwrap();
}
