//! Helpers for the tests that compare our messages with bytes captured from the real tools
//! (`nft`, `ipset`): the captures are hex text, and their sequence numbers differ from ours.

/// The bytes of a hex string as strace prints them (no separators).
pub fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// A netlink message with its sequence number zeroed, so a capture compares with ours.
pub fn without_sequence(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes[8..12].copy_from_slice(&[0; 4]);
    bytes
}
