//! The scripts order ids byte by byte (`id_less` in the prelude, read eight bytes at
//! a time), as Rust orders their bytes, in Redis: not as Lua's `<` would, which
//! follows the locale Redis runs in.

/// For ids of any bytes and lengths, sharing prefixes of any length (past several
/// of `id_less`'s eight-byte reads), `id_less` is the bytes' order.
#[test]
fn the_scripts_order_ids_as_their_bytes() {
    use proptest::prelude::*;
    let (_redis, conn, sha) = super::scripts::prelude_lab(
        "return { id_less(ARGV[1], ARGV[2]) and 1 or 0, id_less(ARGV[2], ARGV[1]) and 1 or 0 }",
    );
    let bytes = |max| proptest::collection::vec(any::<u8>(), 0..max);
    // A shared prefix (up to past 48 bytes, a call's worth), then each one's own end.
    let pairs = (bytes(120), bytes(12), bytes(12)).prop_map(|(shared, a, b)| {
        let mut x = shared.clone();
        x.extend(a);
        let mut y = shared;
        y.extend(b);
        (x, y)
    });
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&pairs, |(a, b)| {
            prop_assume!(!a.is_empty() && !b.is_empty());
            let read: Vec<i64> = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(0)
                .arg(&a)
                .arg(&b)
                .query(&mut *conn.borrow_mut())
                .unwrap();
            prop_assert_eq!(
                read,
                vec![i64::from(a < b), i64::from(b < a)],
                "{:?} {:?}",
                a,
                b
            );
            Ok(())
        })
        .unwrap();
}
