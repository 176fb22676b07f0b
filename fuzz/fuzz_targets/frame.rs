//! Host ↔ enclave frames: arbitrary bytes as the byte stream of a connection, split into frames
//! by the decoder both sides use, and as one frame body. Checks: the same frames and verdict
//! whether the bytes arrive whole, in pieces or through the blocking reader, and every decoded
//! message re-encodes to a frame that decodes to the same message.
#![no_main]

use ephem_fuzz::pieces;
use libfuzzer_sys::fuzz_target;
use protocol::frame::{self, FrameDecoder, FrameError, FrameIoError, Message};

fn decode(parts: &[&[u8]]) -> (Vec<Message>, Option<FrameError>) {
    let mut decoder = FrameDecoder::new();
    let mut messages = Vec::new();
    for part in parts {
        decoder.push(part);
        loop {
            match decoder.next_frame() {
                Ok(Some(message)) => messages.push(message),
                Ok(None) => break,
                Err(e) => return (messages, Some(e)),
            }
        }
    }
    (messages, decoder.finish().err())
}

fn read(mut bytes: &[u8]) -> (Vec<Message>, Option<FrameError>) {
    let mut messages = Vec::new();
    loop {
        match frame::read_frame(&mut bytes) {
            Ok(Some(message)) => messages.push(message),
            Ok(None) => return (messages, None),
            Err(FrameIoError::Frame(e)) => return (messages, Some(e)),
            Err(FrameIoError::Io(e)) => panic!("reading from a slice failed: {e}"),
        }
    }
}

fn round_trip(message: &Message) {
    match frame::encode(message) {
        Ok(bytes) => {
            let len = frame::body_len(bytes[..4].try_into().expect("prefix")).expect("own length prefix");
            assert_eq!(len, bytes.len() - 4);
            assert_eq!(&frame::decode_body(&bytes[4..]).expect("own frame decodes"), message);
        }
        // A body that re-encodes larger than the limit (e.g. bytes sent as an array of integers
        // come back shorter, never longer, but be precise about what is allowed).
        Err(FrameError::TooLarge(_)) => {}
        Err(e) => panic!("a decoded message does not re-encode: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = decode(&[data]);
    assert_eq!(whole, decode(&pieces(data)), "frames depend on how the bytes arrived");
    assert_eq!(whole, read(data), "FrameDecoder and read_frame disagree");
    whole.0.iter().for_each(round_trip);
    if let Ok(message) = frame::decode_body(data) {
        round_trip(&message);
    }
});
