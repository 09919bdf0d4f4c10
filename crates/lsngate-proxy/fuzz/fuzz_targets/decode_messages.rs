//! Fuzz target for the client-facing decoder: arbitrary bytes as a startup packet followed by
//! tagged messages, each parsed as a frontend and a backend message. Must never panic.
//! Run: `cargo fuzz run decode_messages` in crates/lsngate-proxy/fuzz (nightly toolchain).
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use lsngate_proxy::net::{BackendMessage, FrontendMessage, decode_frame, startup::decode_startup};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    if let Ok(Some(_)) = decode_startup(&mut buf, 1 << 16) {
        while let Ok(Some(frame)) = decode_frame(&mut buf, 1 << 16) {
            let _ = FrontendMessage::parse(&frame);
            let _ = BackendMessage::parse(&frame);
        }
    }
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = decode_frame(&mut buf, 1 << 16) {
        if let Ok(message) = FrontendMessage::parse(&frame) {
            assert_eq!(FrontendMessage::parse(&message.to_frame()).ok(), Some(message));
        }
        let _ = BackendMessage::parse(&frame);
    }
});
