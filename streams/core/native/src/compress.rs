//! Compressed state values: a delta is most of stage 1's changelog bytes and its
//! ids repeat (sessions, generation prefixes), so it is written as `COMPRESSED` (a
//! byte no msgpack value starts with), its uncompressed size (4 bytes, little-endian)
//! and an LZ4 block -- the layout of LZ4's `store_size`, which Python reads with
//! `cramjam.lz4.decompress_block` (streams/_layout.py: `compress_state`, `decode_delta`).
//! Compressed here, in the native core, not on the event loop.

/// The first byte of a compressed value.
pub const COMPRESSED: u8 = 0xC1;

/// `raw` compressed, or `raw` itself when that is not smaller (or too large for the size field).
pub fn compress_state(raw: Vec<u8>) -> Vec<u8> {
    let Ok(size) = u32::try_from(raw.len()) else {
        return raw;
    };
    let mut out = vec![0u8; 5 + lz4_flex::block::get_maximum_output_size(raw.len())];
    out[0] = COMPRESSED;
    out[1..5].copy_from_slice(&size.to_le_bytes());
    match lz4_flex::block::compress_into(&raw, &mut out[5..]) {
        Ok(n) if 5 + n < raw.len() => {
            out.truncate(5 + n);
            out
        }
        _ => raw,
    }
}
