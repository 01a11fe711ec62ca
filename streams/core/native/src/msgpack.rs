//! A bounded MessagePack reader and a small writer.
//!
//! The reader never trusts a declared length: every length is checked against the
//! bytes that are left before anything is read, and nothing is allocated from it.
//! Every read returns `None` on anything unexpected, and the caller then hands the
//! message to the Python decoder (msgspec), which names the problem precisely.

/// A string's place in the message: byte offset and byte length (valid UTF-8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    pub off: u32,
    pub len: u32,
}

impl Span {
    #[inline]
    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        let start = self.off as usize;
        buf.get(start..start + self.len as usize).unwrap_or(&[])
    }
}

pub struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    #[inline]
    pub fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    #[inline]
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    #[inline]
    fn be(&mut self, n: usize) -> Option<u64> {
        let bytes = self.take(n)?;
        let mut v = 0u64;
        for &b in bytes {
            v = (v << 8) | b as u64;
        }
        Some(v)
    }

    /// Consumes a nil if one is next.
    #[inline]
    pub fn nil(&mut self) -> bool {
        if self.peek() == Some(0xc0) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// A map header: its number of pairs.
    #[inline]
    pub fn map_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x80..=0x8f => Some((b & 0x0f) as usize),
            0xde => Some(self.be(2)? as usize),
            0xdf => Some(self.be(4)? as usize),
            _ => None,
        }
    }

    /// An array header: its number of items.
    #[inline]
    pub fn array_len(&mut self) -> Option<usize> {
        match self.byte()? {
            b @ 0x90..=0x9f => Some((b & 0x0f) as usize),
            0xdc => Some(self.be(2)? as usize),
            0xdd => Some(self.be(4)? as usize),
            _ => None,
        }
    }

    /// The raw bytes of a str (not validated as UTF-8).
    #[inline]
    pub fn str_bytes(&mut self) -> Option<(usize, &'a [u8])> {
        let n = match self.byte()? {
            b @ 0xa0..=0xbf => (b & 0x1f) as usize,
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return None,
        };
        let start = self.pos;
        Some((start, self.take(n)?))
    }

    /// An id: a str of valid UTF-8 with 1 to `max_chars` characters (msgspec's
    /// `min_length=1, max_length=MAX_ID` count characters, not bytes).
    #[inline]
    pub fn id(&mut self, max_chars: usize) -> Option<Span> {
        let (start, bytes) = self.str_bytes()?;
        if bytes.is_empty() || bytes.len() > 4 * max_chars {
            return None;
        }
        if bytes.iter().fold(0u8, |acc, &b| acc | b) < 0x80 {
            // ASCII (the usual id): valid UTF-8, one character per byte
            if bytes.len() > max_chars {
                return None;
            }
        } else {
            let text = std::str::from_utf8(bytes).ok()?;
            if bytes.len() > max_chars && text.chars().count() > max_chars {
                return None;
            }
        }
        Some(Span { off: u32::try_from(start).ok()?, len: u32::try_from(bytes.len()).ok()? })
    }

    /// Any msgpack integer, as i128 (floats, bools and everything else: None).
    #[inline]
    pub fn int(&mut self) -> Option<i128> {
        let b = self.byte()?;
        Some(match b {
            0x00..=0x7f => b as i128,
            0xe0..=0xff => (b as i8) as i128,
            0xcc => self.be(1)? as i128,
            0xcd => self.be(2)? as i128,
            0xce => self.be(4)? as i128,
            0xcf => self.be(8)? as i128,
            0xd0 => (self.be(1)? as u8 as i8) as i128,
            0xd1 => (self.be(2)? as u16 as i16) as i128,
            0xd2 => (self.be(4)? as u32 as i32) as i128,
            0xd3 => (self.be(8)? as i64) as i128,
            _ => return None,
        })
    }
}

/// A growing MessagePack encoding, smallest form of every header and integer
/// (as msgspec writes them; any decoder reads any form).
#[derive(Default)]
pub struct Writer {
    pub out: Vec<u8>,
}

impl Writer {
    pub fn nil(&mut self) {
        self.out.push(0xc0);
    }

    pub fn bool(&mut self, v: bool) {
        self.out.push(if v { 0xc3 } else { 0xc2 });
    }

    pub fn uint(&mut self, v: u64) {
        let o = &mut self.out;
        if v < 0x80 {
            o.push(v as u8);
        } else if v <= 0xff {
            o.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            o.push(0xcd);
            o.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            o.push(0xce);
            o.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            o.push(0xcf);
            o.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
            return;
        }
        let o = &mut self.out;
        if v >= -32 {
            o.push(v as i8 as u8);
        } else if v >= i8::MIN as i64 {
            o.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i16::MIN as i64 {
            o.push(0xd1);
            o.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i32::MIN as i64 {
            o.push(0xd2);
            o.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            o.push(0xd3);
            o.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn str(&mut self, s: &[u8]) {
        let n = s.len();
        let o = &mut self.out;
        if n < 32 {
            o.push(0xa0 | n as u8);
        } else if n <= 0xff {
            o.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= 0xffff {
            o.push(0xda);
            o.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            o.push(0xdb);
            o.extend_from_slice(&(n as u32).to_be_bytes());
        }
        o.extend_from_slice(s);
    }

    pub fn opt_str(&mut self, s: Option<&[u8]>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }

    pub fn array(&mut self, n: usize) {
        let o = &mut self.out;
        if n < 16 {
            o.push(0x90 | n as u8);
        } else if n <= 0xffff {
            o.push(0xdc);
            o.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            o.push(0xdd);
            o.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub fn map(&mut self, n: usize) {
        let o = &mut self.out;
        if n < 16 {
            o.push(0x80 | n as u8);
        } else if n <= 0xffff {
            o.push(0xde);
            o.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            o.push(0xdf);
            o.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }
}
