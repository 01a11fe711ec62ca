//! The records topic's messages (docs/contract.md §4: the msgpack union
//! `GenerationRecord | RecordBatch | BatchMarker`, tag field `type`), parsed in place.
//!
//! The parser accepts only a clean, fully valid record or packed batch, exactly as
//! msgspec would decode it (types and limits of docs/contract.md §1 and §1.1). Anything
//! else -- an invalid or unknown field, an unknown tag, a duplicate key, a marker, a
//! record naming another run than its envelope, trailing bytes -- returns `None`, and
//! the message goes to the Python decoder, whose dead-letter reasons name the problem.

use crate::msgpack::{Reader, Span};

/// MAX_ID of docs/contract.md §1.1: characters of an id, weight_version or task.
pub const MAX_ID: usize = 1024;
/// MAX_BINS: histogram bins.
pub const MAX_BINS: usize = 1024;
/// MAX_COUNTER: a counter or histogram bin.
pub const MAX_COUNTER: i128 = (1 << 32) - 1;

/// One valid record of a message; strings are spans of the message's bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rec {
    pub batch_id: Span,
    pub session: Span,
    pub generation: Span,
    pub sample: Option<Span>,
    pub state_hash: Option<Span>,
    /// accepted, proposed, verify, completion (None: unknown)
    pub counters: [Option<u32>; 4],
    /// (first index, length) in `Parsed::bins`
    pub hist: Option<(u32, u32)>,
    pub producer: Option<Span>,
    pub version: Option<Span>,
    pub run: Option<Span>,
    pub task: Option<Span>,
    /// (revision 5) how many policy updates the draft is behind
    pub draft_lag: Option<u32>,
    /// where the record's own encoding lies in the message (to rebuild it for a dead letter)
    pub raw_start: u32,
    pub raw_end: u32,
}

/// A run of records of one batch: records `start..start + count`.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub start: u32,
    pub count: u32,
    /// the batch's run: the record's own run_id, else the envelope's
    pub run: Option<Span>,
    pub batch_id: Span,
}

#[derive(Debug, Default)]
pub struct Parsed {
    pub records: Vec<Rec>,
    pub bins: Vec<u64>,
    pub groups: Vec<Group>,
    pub producer: Option<Span>,
    pub run: Option<Span>,
}

const F_BATCH_ID: u32 = 1;
const F_SESSION: u32 = 1 << 1;
const F_GENERATION: u32 = 1 << 2;
const F_SAMPLE: u32 = 1 << 3;
const F_HASH: u32 = 1 << 4;
const F_ACCEPTED: u32 = 1 << 5;
const F_PROPOSED: u32 = 1 << 6;
const F_VERIFY: u32 = 1 << 7;
const F_COMPLETION: u32 = 1 << 8;
const F_HIST: u32 = 1 << 9;
const F_PRODUCER: u32 = 1 << 10;
const F_VERSION: u32 = 1 << 11;
const F_RUN: u32 = 1 << 12;
const F_TASK: u32 = 1 << 13;
const F_DRAFT_LAG: u32 = 1 << 14;
const F_TYPE: u32 = 1 << 15;
const F_RECORDS: u32 = 1 << 16;
const RECORD_FIELDS: u32 = (1 << 15) - 1;
const REQUIRED: u32 = F_BATCH_ID | F_SESSION | F_GENERATION;

#[derive(PartialEq, Eq, Clone, Copy)]
enum Tag {
    Record,
    Batch,
}

#[inline]
fn field(key: &[u8]) -> Option<u32> {
    // by length first: one comparison of the whole key at most, mostly
    let (f, name): (u32, &[u8]) = match key.len() {
        // "type" and "task" have one length: told apart by their second byte
        4 if key[1] == b'a' => (F_TASK, b"task"),
        4 => (F_TYPE, b"type"),
        6 if key[0] == b'v' => (F_VERIFY, b"verify"),
        6 => (F_RUN, b"run_id"),
        7 => (F_RECORDS, b"records"),
        8 => match key[0] {
            b'b' => (F_BATCH_ID, b"batch_id"),
            b'a' => (F_ACCEPTED, b"accepted"),
            _ => (F_PROPOSED, b"proposed"),
        },
        // "sample_id" and "draft_lag" have one length: told apart by their first byte
        9 if key[0] == b'd' => (F_DRAFT_LAG, b"draft_lag"),
        9 => (F_SAMPLE, b"sample_id"),
        10 if key[0] == b's' && key[1] == b'e' => (F_SESSION, b"session_id"),
        10 if key[0] == b's' => (F_HASH, b"state_hash"),
        10 => (F_COMPLETION, b"completion"),
        11 => (F_PRODUCER, b"producer_id"),
        13 => (F_GENERATION, b"generation_id"),
        14 => (F_VERSION, b"weight_version"),
        16 => (F_HIST, b"accept_histogram"),
        _ => return None,
    };
    (key == name).then_some(f)
}

fn tag(r: &mut Reader) -> Option<Tag> {
    let (_, value) = r.str_bytes()?;
    match value {
        b"record" => Some(Tag::Record),
        b"batch" => Some(Tag::Batch),
        _ => None, // a marker or an unknown tag: Python decodes it
    }
}

#[inline]
fn opt_id(r: &mut Reader) -> Option<Option<Span>> {
    if r.nil() {
        return Some(None);
    }
    Some(Some(r.id(MAX_ID)?))
}

#[inline]
fn counter(r: &mut Reader) -> Option<u32> {
    // the common case, a positive fixint, first
    if let Some(b @ 0x00..=0x7f) = r.peek() {
        r.pos += 1;
        return Some(b as u32);
    }
    let v = r.int()?;
    if (0..=MAX_COUNTER).contains(&v) {
        Some(v as u32)
    } else {
        None
    }
}

#[inline]
fn opt_counter(r: &mut Reader) -> Option<Option<u32>> {
    if r.nil() {
        return Some(None);
    }
    Some(Some(counter(r)?))
}

/// One field of a record (the key already read); false: not acceptable.
#[inline]
fn record_field(r: &mut Reader, f: u32, rec: &mut Rec, bins: &mut Vec<u64>) -> Option<()> {
    match f {
        F_BATCH_ID => rec.batch_id = r.id(MAX_ID)?,
        F_SESSION => rec.session = r.id(MAX_ID)?,
        F_GENERATION => rec.generation = r.id(MAX_ID)?,
        F_SAMPLE => rec.sample = opt_id(r)?,
        F_HASH => rec.state_hash = opt_id(r)?,
        F_ACCEPTED => rec.counters[0] = opt_counter(r)?,
        F_PROPOSED => rec.counters[1] = opt_counter(r)?,
        F_VERIFY => rec.counters[2] = opt_counter(r)?,
        F_COMPLETION => rec.counters[3] = opt_counter(r)?,
        F_HIST => {
            if r.nil() {
                rec.hist = None;
            } else {
                let n = r.array_len()?;
                if n > MAX_BINS {
                    return None;
                }
                bins.reserve(n.min(r.buf.len() - r.pos)); // a bin takes at least one byte
                let first = u32::try_from(bins.len()).ok()?;
                for _ in 0..n {
                    bins.push(counter(r)? as u64);
                }
                rec.hist = Some((first, n as u32));
            }
        }
        F_PRODUCER => rec.producer = opt_id(r)?,
        F_VERSION => rec.version = opt_id(r)?,
        F_RUN => rec.run = opt_id(r)?,
        F_TASK => rec.task = opt_id(r)?,
        F_DRAFT_LAG => rec.draft_lag = opt_counter(r)?,
        _ => return None,
    }
    Some(())
}

/// A record inside a packed batch: a map of record fields, `type` optional and "record" if present.
#[inline]
fn nested_record(r: &mut Reader, rec: &mut Rec, bins: &mut Vec<u64>) -> Option<()> {
    let start = r.pos;
    let n = r.map_len()?;
    let mut seen = 0u32;
    for _ in 0..n {
        let (_, key) = r.str_bytes()?;
        let f = field(key)?;
        if seen & f != 0 {
            return None; // duplicate key
        }
        seen |= f;
        if f == F_TYPE {
            if tag(r)? != Tag::Record {
                return None;
            }
        } else if f & RECORD_FIELDS != 0 {
            record_field(r, f, rec, bins)?;
        } else {
            return None;
        }
    }
    if seen & REQUIRED != REQUIRED {
        return None;
    }
    rec.raw_start = u32::try_from(start).ok()?;
    rec.raw_end = u32::try_from(r.pos).ok()?;
    Some(())
}

/// Parses one records-topic message; `None`: let Python decode it.
pub fn parse(data: &[u8]) -> Option<Parsed> {
    if u32::try_from(data.len()).is_err() {
        return None;
    }
    let mut r = Reader::new(data);
    let n = r.map_len()?;
    let mut out = Parsed::default();
    let mut rec = Rec::default();
    let mut seen = 0u32;
    let mut kind = None;
    for _ in 0..n {
        let (_, key) = r.str_bytes()?;
        let f = field(key)?;
        if seen & f != 0 {
            return None;
        }
        seen |= f;
        match f {
            F_TYPE => kind = Some(tag(&mut r)?),
            F_RECORDS => {
                let count = r.array_len()?;
                // no declared length is trusted: a record takes at least 16 bytes
                out.records.reserve(count.min((data.len() - r.pos) / 16));
                for _ in 0..count {
                    out.records.push(Rec::default());
                    let rec = out.records.last_mut()?;
                    nested_record(&mut r, rec, &mut out.bins)?;
                }
            }
            _ => record_field(&mut r, f, &mut rec, &mut out.bins)?,
        }
    }
    if !r.at_end() {
        return None; // trailing bytes
    }
    match kind? {
        Tag::Record => {
            if seen & !(RECORD_FIELDS | F_TYPE) != 0 || seen & REQUIRED != REQUIRED {
                return None;
            }
            rec.raw_start = 0;
            rec.raw_end = data.len() as u32;
            out.producer = rec.producer;
            out.run = None;
            out.records.push(rec);
        }
        Tag::Batch => {
            // a RecordBatch has records, producer_id and run_id; any other field is unknown to it
            if seen & !(F_TYPE | F_RECORDS | F_PRODUCER | F_RUN) != 0 || seen & F_RECORDS == 0 {
                return None;
            }
            out.producer = rec.producer;
            out.run = rec.run;
            if let Some(envelope) = out.run {
                let want = envelope.get(data);
                if out.records.iter().any(|x| x.run.is_some_and(|run| run.get(data) != want)) {
                    return None; // a record of another run: invalid, Python names it
                }
            }
        }
    }
    group(data, &mut out);
    Some(out)
}

/// The batches of a message, as the Python path splits them: one group when every
/// record names the same (batch_id, run_id), else one group per record.
fn group(data: &[u8], out: &mut Parsed) {
    let Some(first) = out.records.first() else {
        return;
    };
    let batch = first.batch_id.get(data);
    let run = first.run.map(|s| s.get(data));
    let same = out
        .records
        .iter()
        .all(|x| x.batch_id.get(data) == batch && x.run.map(|s| s.get(data)) == run);
    let key_of = |x: &Rec| (x.run.or(out.run), x.batch_id);
    if same {
        let (run, batch_id) = key_of(first);
        out.groups.push(Group { start: 0, count: out.records.len() as u32, run, batch_id });
    } else {
        let groups = out
            .records
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let (run, batch_id) = key_of(x);
                Group { start: i as u32, count: 1, run, batch_id }
            })
            .collect();
        out.groups = groups;
    }
}
