//! A push body's rules, read through the tree and from the bytes alike.

use proptest::prelude::*;
use serde_json::json;

use super::super::due::DUE_KEYS;
use super::*;
use crate::message::Due;
use delayq_harness::props::{expect, json, text};

fn config() -> Config {
    Config::from_toml("[forwarder]\nid_field = \"msg-id\"", std::iter::empty()).unwrap()
}

/// The push keys, for the strategies that want them static.
fn keys() -> &'static [&'static str] {
    static KEYS: LazyLock<Vec<&'static str>> =
        LazyLock::new(|| PUSH_KEYS.iter().map(String::as_str).collect());
    &KEYS
}

/// `parse_push`, checking on the way that a body it accepts is one the
/// documented type describes.
/// Read from its bytes as well, the body makes the same message or refusal.
fn parse(body: &Value) -> Result<(NewMessage, ScheduleMode), ApiError> {
    let parsed = parse_push(body, &config());
    if parsed.is_ok() {
        let typed = serde_json::from_value::<PushRequest>(body.clone());
        assert!(typed.is_ok(), "accepted {body}, undocumented: {typed:?}");
    }
    let from_bytes = parse_push_bytes(body.to_string().as_bytes(), &config());
    assert_eq!(outcome(&from_bytes), outcome(&parsed), "{body}");
    parsed
}

/// What a parse made (an id made here as such), or its refusal.
pub(in crate::api::messages) fn outcome(
    parsed: &Result<(NewMessage, ScheduleMode), ApiError>,
) -> String {
    match parsed {
        Ok((msg, mode)) => {
            let mut msg = msg.clone();
            if *mode == ScheduleMode::Fresh {
                msg.id = MessageId::parse("made-here").unwrap();
            }
            format!("{mode:?} {msg:?}")
        }
        Err(e) => refusal(e),
    }
}

/// A refusal as its status, code and detail.
pub(in crate::api::messages) fn refusal(e: &ApiError) -> String {
    format!("{} {}: {}", e.status, e.code, e.detail)
}

/// A body whose keys are mostly push keys holding mostly their kind of value,
/// with nulls, other values and an unknown key among them.
pub(in crate::api::messages) fn push_like() -> impl Strategy<Value = Value> {
    let anything = || json(&["a"]);
    // Each key: its kind of value, any value (null among them), or none.
    let key = |name: &'static str, valid: BoxedStrategy<Value>, weights: [u32; 3]| {
        prop_oneof![
            weights[0] => valid.prop_map(Some),
            weights[1] => anything().prop_map(Some),
            weights[2] => Just(None),
        ]
        .prop_map(move |v| v.map(|v| (name.to_owned(), v)))
        .boxed()
    };
    // Mostly the first pattern, sometimes the second (which breaks a rule).
    let matching = |pattern: &'static str, broken: &'static str| {
        prop_oneof![8 => pattern, 1 => broken]
            .prop_map(Value::from)
            .boxed()
    };
    let whole = |top: u64| {
        prop_oneof![4 => 0..top, 1 => any::<u64>()]
            .prop_map(Value::from)
            .boxed()
    };
    let duration = || {
        prop_oneof![
            8 => "[0-9]{1,5}(ms|s|m|h|d)",
            1 => "[0-9]{1,3}h [0-9]{1,3}m",
            1 => "-?[0-9]{1,9} ?[a-z]{0,2}",
        ]
        .prop_map(Value::from)
        .boxed()
    };
    let optional = [4, 1, 10];
    vec![
        key(
            "stream",
            matching("[a-z][a-z:-]{0,10}", "delayq:[a-z]{1,4}| "),
            [30, 1, 1],
        ),
        key("payload", text().prop_map(Value::from).boxed(), [30, 1, 1]),
        key("fields", anything().boxed(), [0, 1, 30]),
        key("delay", duration(), [20, 1, 8]),
        key("delay_ms", whole(100_000), [3, 1, 20]),
        key("deliver_at", anything().boxed(), [0, 1, 30]),
        key(
            "id",
            matching("[A-Za-z0-9._:-]{1,130}", "a b|\\PC{0,4}"),
            optional,
        ),
        key("priority", whole(12), optional),
        key("ttl", duration(), optional),
        key("ttl_ms", whole(100_000), optional),
        key(
            "replace",
            any::<bool>().prop_map(Value::from).boxed(),
            optional,
        ),
        key(
            "key",
            matching("[A-Za-z0-9._:-]{1,130}", "\\PC{0,4}"),
            optional,
        ),
        key("colour", Just(Value::from("red")).boxed(), [1, 0, 40]),
    ]
    .prop_map(|pairs| Value::Object(pairs.into_iter().flatten().collect()))
}

/// The common shape is read straight from the bytes; a body of any other shape
/// goes through the tree.
#[test]
fn the_common_shape_is_read_straight_from_the_bytes() {
    for (body, plain) in [
        (r#"{"stream":"orders","payload":"x","delay":"1s"}"#, true),
        (
            r#"{"stream":"orders","payload":"a \"quoted\" é","delay_ms":5,"id":"o-1","priority":9,"ttl":"1h","replace":true,"key":"k"}"#,
            true,
        ),
        (
            r#"{"stream":"orders","payload":"x","delay":"1s","id":null,"priority":null,"ttl_ms":null,"replace":null,"key":null}"#,
            true,
        ),
        (r#"{"stream":"orders","payload":"x","delay":null}"#, false),
        (
            r#"{"stream":"orders","payload":"x","delay":"1\u0073"}"#,
            false,
        ),
        (r#"{"stream":"orders","payload":5,"delay":"1s"}"#, false),
        (
            r#"{"stream":"orders","fields":{"a":"1"},"delay":"1s"}"#,
            false,
        ),
        (r#"{"stream":"orders","payload":"x","deliver_at":5}"#, false),
        (
            r#"{"stream":"orders","payload":"x","delay":"1s","colour":"red"}"#,
            false,
        ),
        (
            r#"{"stream":"orders","payload":"x","delay":"1s","priority":-1}"#,
            false,
        ),
        (r#"["orders","x","1s"]"#, false),
    ] {
        assert_eq!(
            read_object::<Plain>(body.as_bytes()).is_some(),
            plain,
            "{body}"
        );
        parse(&serde_json::from_str(body).unwrap()).ok();
    }
}

/// A push of `x` to `orders` in 1s, with `extra`'s keys put over it (a due-time
/// key replaces the delay).
fn push(extra: Value) -> Result<NewMessage, ApiError> {
    let mut body = json!({ "stream": "orders", "payload": "x", "delay": "1s" });
    let extra = extra.as_object().unwrap();
    if extra.keys().any(|k| DUE_KEYS.contains(&k.as_str())) {
        body.as_object_mut().unwrap().remove("delay");
    }
    if extra.contains_key("fields") {
        body.as_object_mut().unwrap().remove("payload");
    }
    body.as_object_mut().unwrap().extend(extra.clone());
    parse(&body).map(|(msg, _)| msg)
}

#[test]
fn the_accepted_keys_are_the_documented_ones_in_order() {
    assert_eq!(
        keys(),
        [
            "stream",
            "payload",
            "fields",
            "delay",
            "delay_ms",
            "deliver_at",
            "id",
            "priority",
            "ttl",
            "ttl_ms",
            "replace",
            "key"
        ]
    );
    let refusal = push(json!({ "colour": "red" })).unwrap_err();
    assert_eq!(
        refusal.detail,
        format!("colour: unknown field (known: {})", keys().join(", "))
    );
}

#[test]
fn own_field_names_are_refused_in_either_form() {
    for fields in [
        json!({ "a": "1", "delayq-id": "x" }),
        json!([["a", "1"], ["msg-id", "x"]]),
    ] {
        let refusal = push(json!({ "fields": fields })).unwrap_err();
        assert_eq!(refusal.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(refusal.detail.contains("is reserved"), "{}", refusal.detail);
    }
}

/// An optional key sent as null is the key left out.
#[test]
fn null_optional_keys_are_not_given() {
    let plain = push(json!({})).unwrap();
    for extra in [
        json!({ "id": null }),
        json!({ "priority": null }),
        json!({ "ttl": null }),
        json!({ "ttl_ms": null }),
        json!({ "ttl": null, "ttl_ms": null }),
    ] {
        let msg = push(extra.clone()).unwrap();
        assert_eq!(
            (msg.priority, msg.ttl),
            (plain.priority, plain.ttl),
            "{extra}"
        );
    }
    let body =
        json!({ "stream": "orders", "payload": "x", "delay": "1s", "id": "o-1", "replace": null });
    assert_eq!(parse(&body).unwrap().1, ScheduleMode::New);
    let both = push(json!({ "ttl": "1h", "ttl_ms": 5 })).unwrap_err();
    assert_eq!(both.detail, "ttl, ttl_ms: give one, not both");
}

#[test]
fn an_id_made_here_is_fresh_and_one_given_is_not() {
    for (extra, mode) in [
        (json!({}), ScheduleMode::Fresh),
        (json!({ "id": null }), ScheduleMode::Fresh),
        (json!({ "replace": true }), ScheduleMode::Fresh),
        (json!({ "id": "o-1" }), ScheduleMode::New),
        (json!({ "id": "o-1", "replace": false }), ScheduleMode::New),
        (
            json!({ "id": "o-1", "replace": true }),
            ScheduleMode::Replace,
        ),
    ] {
        let mut body = json!({ "stream": "orders", "payload": "x", "delay": "1s" });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        assert_eq!(parse(&body).unwrap().1, mode, "{extra}");
    }
}

#[test]
fn every_form_of_each_field_is_documented() {
    for extra in [
        json!({ "payload": { "a": [1, null] } }),
        json!({ "payload": 5 }),
        json!({ "fields": { "a": "1", "b": 2.5, "c": true } }),
        json!({ "fields": [["a", "1"], ["b", -2], ["c", false]] }),
        json!({ "delay_ms": 5 }),
        json!({ "deliver_at": 1_600_000_000_000u64 }),
        json!({ "deliver_at": "2026-11-22T10:00:00Z" }),
        json!({ "id": "order-42", "priority": 9, "ttl": "1h", "replace": true }),
        json!({ "id": null, "priority": null, "ttl_ms": 1000, "replace": false }),
        json!({ "ttl": null, "ttl_ms": 1000, "replace": null }),
        json!({ "ttl": "1h", "ttl_ms": null }),
    ] {
        push(extra.clone()).unwrap_or_else(|e| panic!("{extra}: {}", e.detail));
    }
}

/// Numbers are written as their value; one that a double cannot hold exactly
/// is refused, wherever it is, rather than written with other digits.
#[test]
fn numbers_are_written_as_their_value_or_refused() {
    #[rustfmt::skip]
    let cases: &[(&str, Option<&str>)] = &[
        (r#"{"fields": {"n": 42}}"#, Some("42")),
        (r#"{"fields": {"n": -9223372036854775808}}"#, Some("-9223372036854775808")),
        (r#"{"fields": {"n": 18446744073709551615}}"#, Some("18446744073709551615")),
        (r#"{"fields": {"n": 2.5}}"#, Some("2.5")),
        (r#"{"fields": {"n": 1e2}}"#, Some("100.0")),
        (r#"{"fields": {"n": 9007199254740991.0}}"#, Some("9007199254740991.0")),
        (r#"{"fields": {"n": 9007199254740992.0}}"#, None),
        (r#"{"fields": {"n": 18446744073709551616}}"#, None),
        (r#"{"fields": {"n": -9223372036854775809}}"#, None),
        (r#"{"fields": [["n", 12345678901234567890123]]}"#, None),
        (r#"{"payload": 12345678901234567890123}"#, None),
        (r#"{"payload": {"a": [1, {"b": 1e300}]}}"#, None),
        (r#"{"payload": {"a": [1, {"b": 1.5}]}}"#, Some(r#"{"a":[1,{"b":1.5}]}"#)),
    ];
    for (extra, want) in cases {
        let got = push(serde_json::from_str(extra).unwrap());
        match (got, want) {
            (Ok(msg), Some(text)) => assert_eq!(msg.fields[0].1, *text, "{extra}"),
            (Err(e), None) => assert!(
                e.detail.contains("cannot be kept exactly"),
                "{extra}: {}",
                e.detail
            ),
            (got, want) => panic!("{extra}: {got:?}, wanted {want:?}"),
        }
    }
}

proptest! {
    #[test]
    fn numbers_a_double_holds_exactly_are_written_as_that_double(x in -EXACT_UP_TO..EXACT_UP_TO) {
        let body = format!(r#"{{"fields": {{"n": {x:e}}}}}"#);
        let msg = push(serde_json::from_str(&body).unwrap()).unwrap();
        prop_assert_eq!(msg.fields[0].1.parse::<f64>().unwrap(), x, "{}", body);
    }

    #[test]
    fn push_bodies_never_panic(body in json(keys())) {
        let _ = parse(&body);
    }

    /// Read from its bytes or through the tree, a push makes the same message or
    /// the same refusal (`parse` compares them).
    #[test]
    fn a_push_reads_the_same_either_way(body in push_like()) {
        let _ = parse(&body);
    }

    #[test]
    fn push_fields_never_panic(fields in json(&["a", "delayq-id"])) {
        let _ = push(json!({ "fields": fields }));
    }

    #[test]
    fn delays_past_max_delay_are_refused_not_saturated(ms: u64) {
        let max = config().api.limits.max_delay.as_millis() as u64;
        let want = (ms <= max).then_some(Due::In(Duration::from_millis(ms)));
        expect(&ms.to_string(), push(json!({ "delay_ms": ms })).map(|m| m.due), want)?;
    }

    #[test]
    fn field_lists_round_trip(pairs in prop::collection::vec(("[a-z][a-z0-9_]{0,10}", "\\PC{0,20}"), 1..10)) {
        let got = push(json!({ "fields": pairs })).map(|m| m.fields);
        expect("fields", got, Some(pairs.clone()))?;
    }

    #[test]
    fn priorities_outside_0_to_9_are_refused(priority: i64) {
        let want = (0..=9).contains(&priority).then_some(priority as u8);
        expect(&priority.to_string(), push(json!({ "priority": priority })).map(|m| m.priority), want)?;
    }

    #[test]
    fn ttl_ms_round_trips(ms in 1u64..) {
        let want = Some(Some(Duration::from_millis(ms)));
        expect(&ms.to_string(), push(json!({ "ttl_ms": ms })).map(|m| m.ttl), want)?;
    }

    #[test]
    fn ttls_beyond_u64_milliseconds_are_refused(secs: u64) {
        let text = humantime::format_duration(Duration::from_secs(secs)).to_string();
        let fits = secs > 0 && secs.checked_mul(1000).is_some();
        let want = fits.then_some(Some(Duration::from_secs(secs)));
        expect(&text, push(json!({ "ttl": text })).map(|m| m.ttl), want)?;
    }
}
