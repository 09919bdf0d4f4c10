//! Token and LSN parsing on arbitrary client bytes: never panics, and whatever verifies
//! re-issues to a text that verifies to the same token.
#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use lsngate_core::{Lsn, TokenCodec};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
    if let Ok(lsn) = Lsn::parse(text) {
        assert_eq!(Lsn::parse(&lsn.to_string()), Ok(lsn));
    }
    let signed = TokenCodec::signed(b"fuzz-key".to_vec());
    let unsigned = TokenCodec::unsigned();
    for codec in [&signed, &unsigned] {
        if let Ok(token) = codec.verify(text, now) {
            let again = codec.verify(&codec.issue(&token, now), now);
            assert_eq!(again.map(|t| t.lsn), Ok(token.lsn));
        }
    }
});
