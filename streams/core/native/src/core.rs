//! One batch's dedup state on one partition: the twin of streams/_state.py's
//! `BatchState`, without Python objects (docs/contract.md §3, §3.1).
//!
//! Layout: every string but the generation ids is interned once per batch
//! (sessions, samples, state hashes, weight versions, tasks); a generation's id lives
//! in an arena and its entry is 40 bytes: the counters, its label (its weight
//! version, or the triple of its weight version, task and draft lag, interned: a batch
//! holds few),
//! the first occurrence's sample, flags and the index of its state hash and histogram
//! (whose bins live in one arena). Rarer parts -- more occurrences, counters past 32 bits
//! (only from a changelog written before the limits) -- live in side tables.
//! `apply` is the one implementation of the dedup rule.

use hashbrown::{DefaultHashBuilder, HashMap, HashSet, HashTable};
use std::hash::BuildHasher;

use crate::exact::{div, grow};
use crate::msgpack::Writer;

/// More distinct known weight versions (tasks, draft lags) than this in one batch: no
/// breakdown (§3.1, §3.4, §3.6).
pub const MAX_BREAKDOWN_KEYS: usize = 64;
/// The quarter-token buckets of the spread of tokens per verify step (§3.7).
pub const DISTRIBUTION_BUCKETS: usize = 64;

/// A record as the rule sees it (strings are valid UTF-8).
pub struct Record<'a> {
    pub session: &'a [u8],
    pub generation: &'a [u8],
    pub sample: Option<&'a [u8]>,
    pub state_hash: Option<&'a [u8]>,
    /// accepted, proposed, verify, completion
    pub counters: [Option<u64>; 4],
    pub hist: Option<&'a [u64]>,
    pub version: Option<&'a [u8]>,
    pub task: Option<&'a [u8]>,
    /// (revision 5) how many policy updates the draft is behind
    pub draft_lag: Option<u64>,
}

/// What went wrong on input the rule cannot hold (never on wire-valid records).
#[derive(Debug)]
pub struct TooLarge(pub &'static str);

// -- interned strings ------------------------------------------------------------------
#[derive(Default)]
struct Interner {
    bytes: Vec<u8>,
    spans: Vec<(usize, u32)>, // id - 1 -> (offset, length)
    table: HashTable<u32>,
}

impl Interner {
    fn get(&self, hasher: &DefaultHashBuilder, s: &[u8]) -> Option<u32> {
        let hash = hasher.hash_one(s);
        self.table.find(hash, |&id| self.resolve(id) == s).copied()
    }

    /// The string's id (1-based; 0 is "none").
    fn intern(&mut self, hasher: &DefaultHashBuilder, s: &[u8]) -> Result<u32, TooLarge> {
        let hash = hasher.hash_one(s);
        if let Some(&id) = self.table.find(hash, |&id| resolve(&self.bytes, &self.spans, id) == s) {
            return Ok(id);
        }
        // ids stay below 2^31: a label (`Labels`) tells a weight version's id by its top bit
        let id = u32::try_from(self.spans.len() + 1)
            .ok()
            .filter(|&id| id < TASKED)
            .ok_or(TooLarge("too many distinct ids in one batch"))?;
        let len = u32::try_from(s.len()).map_err(|_| TooLarge("an id longer than 4 GiB"))?;
        self.spans.push((self.bytes.len(), len));
        self.bytes.extend_from_slice(s);
        let (bytes, spans) = (&self.bytes, &self.spans);
        self.table.insert_unique(hash, id, |&id| hasher.hash_one(resolve(bytes, spans, id)));
        Ok(id)
    }

    #[inline]
    fn resolve(&self, id: u32) -> &[u8] {
        resolve(&self.bytes, &self.spans, id)
    }

    fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.spans.capacity() * 16 + self.table.allocation_size()
    }
}

#[inline]
fn resolve<'a>(bytes: &'a [u8], spans: &[(usize, u32)], id: u32) -> &'a [u8] {
    match spans.get((id as usize).wrapping_sub(1)) {
        Some(&(off, len)) => bytes.get(off..off + len as usize).unwrap_or(&[]),
        None => &[],
    }
}

// -- entries ---------------------------------------------------------------------------
const KNOWN: [u8; 4] = [1, 2, 4, 8];
const CONFLICT: u8 = 16;
/// counters or bins past 32 bits, in `big`
const BIG: u8 = 32;
/// occurrences beyond the first in `extras`
const MULTI: u8 = 64;
/// no occurrence yet (an entry a delta restored before its occurrences)
const NO_OCC: u8 = 128;
/// in `gen_len`: created since the last delta
const NEW: u16 = 1 << 15;
const MAX_GEN_LEN: usize = (1 << 15) - 1;

#[derive(Clone, Copy, Default)]
struct Entry {
    gen_off: u32,
    session: u32,
    /// the first occurrence's sample (0: sample_id None)
    sample: u32,
    /// the weight_version, task and draft lag (`Labels`; 0: none known)
    label: u32,
    counters: [u32; 4],
    /// index in `aux` of the state hash and histogram (0: neither)
    aux: u32,
    gen_len: u16,
    gen_hi: u8,
    flags: u8,
}

/// A value's state hash and histogram (bins `hist_off..hist_off + hist_len` of `bins`).
#[derive(Clone, Copy, Default)]
struct Aux {
    state_hash: u32,
    hist_off: u32,
    hist_len: u32,
}

const NO_HIST: u32 = u32::MAX;

/// A value with a counter or a bin past 32 bits.
struct Big {
    counters: [u64; 4],
    hist: Option<Box<[u64]>>,
}

/// A histogram as stored.
#[derive(Clone, Copy)]
enum Hist<'a> {
    Small(&'a [u32]),
    Wide(&'a [u64]),
}

impl Hist<'_> {
    fn len(&self) -> usize {
        match self {
            Hist::Small(h) => h.len(),
            Hist::Wide(h) => h.len(),
        }
    }

    fn values(&self) -> impl Iterator<Item = u64> + '_ {
        let (small, wide) = match self {
            Hist::Small(h) => (Some(h.iter().map(|&b| b as u64)), None),
            Hist::Wide(h) => (None, Some(h.iter().copied())),
        };
        small.into_iter().flatten().chain(wide.into_iter().flatten())
    }

    fn same(&self, other: &[u64]) -> bool {
        self.len() == other.len() && self.values().zip(other).all(|(a, &b)| a == b)
    }
}

/// A value to store or compare: (state_hash, counters, histogram, label).
pub struct Value<'a> {
    pub state_hash: u32,
    pub counters: [Option<u64>; 4],
    pub hist: Option<&'a [u64]>,
    pub label: u32,
}

/// In a label: the rest is the index of a (weight_version, task, draft lag) triple in `Labels`.
const TASKED: u32 = 1 << 31;

/// A label's parts: interned weight_version and task ids (0: unknown) and the draft lag + 1
/// (0: unknown; a lag is at most 2^32 - 1, so the + 1 fits).
type Parts = (u32, u32, u64);

/// A value's weight version, task and draft lag as one u32, its label: for a value that
/// names neither a task nor a lag, its weight_version's interned id itself (0: unknown), so
/// such a record costs no lookup; for one that does, `TASKED` | the index of its
/// (weight_version, task, lag) triple (a batch has few). Two values agree on all three
/// exactly when their labels are equal (interned ids stay below `TASKED`).
#[derive(Default)]
struct Labels {
    triples: Vec<Parts>,
    index: HashMap<Parts, u32>,
    /// the last triple looked up and its label (records come in runs)
    last: (Parts, u32),
}

impl Labels {
    #[inline(always)]
    fn label(&mut self, version: u32, task: u32, lag: Option<u64>) -> Result<u32, TooLarge> {
        let lag = lag.map_or(0, |l| l.saturating_add(1));
        if task == 0 && lag == 0 {
            return Ok(version);
        }
        if self.last.1 != 0 && self.last.0 == (version, task, lag) {
            return Ok(self.last.1);
        }
        self.triple_label((version, task, lag))
    }

    #[inline(never)]
    fn triple_label(&mut self, parts: Parts) -> Result<u32, TooLarge> {
        let label = match self.index.get(&parts) {
            Some(&label) => label,
            None => {
                let label = u32::try_from(self.triples.len())
                    .ok()
                    .filter(|&i| i < TASKED)
                    .ok_or(TooLarge("too many (weight version, task, draft lag) labels in one batch"))?
                    | TASKED;
                self.triples.push(parts);
                self.index.insert(parts, label);
                label
            }
        };
        self.last = (parts, label);
        Ok(label)
    }

    /// (weight_version, task, draft lag + 1) of a label.
    #[inline]
    fn parts(&self, label: u32) -> Parts {
        if label & TASKED == 0 {
            return (label, 0, 0);
        }
        self.triples.get((label & !TASKED) as usize).copied().unwrap_or((0, 0, 0))
    }

    fn heap_bytes(&self) -> usize {
        self.triples.capacity() * 16 + self.index.allocation_size()
    }
}

/// Per breakdown key (and for the batch): [unique, accepted, proposed, verify,
/// completion, paired accepted, paired proposed, accept covered, paired completion,
/// paired verify, verify covered], as `core.state._Sums` adds them.
pub type Sums = [u128; 11];

fn add_counters(s: &mut Sums, c: [Option<u64>; 4]) {
    s[0] += 1;
    for i in 0..4 {
        if let Some(v) = c[i] {
            s[1 + i] += v as u128;
        }
    }
    if let (Some(a), Some(p)) = (c[0], c[1]) {
        s[5] += a as u128;
        s[6] += p as u128;
        s[7] += 1;
    }
    if let (Some(v), Some(comp)) = (c[2], c[3]) {
        s[8] += comp as u128;
        s[9] += v as u128;
        s[10] += 1;
    }
}

/// Adds `len` bins to a summed histogram (shorter ones padded with zeros).
fn add_bins(out: &mut Option<Vec<u128>>, len: usize, bins: impl Iterator<Item = u128>) {
    let out = out.get_or_insert_with(Vec::new);
    if len > out.len() {
        out.resize(len, 0);
    }
    for (o, h) in out.iter_mut().zip(bins) {
        *o += h;
    }
}

/// A histogram contradicts its own counters (docs/contract.md §3.5, `core.state.inconsistent`):
/// verify known and not sum(H), or accepted known and not sum(i * H[i]).
fn inconsistent(counters: [Option<u64>; 4], hist: Hist) -> bool {
    let (mut steps, mut accepted) = (0u128, 0u128);
    for (i, b) in hist.values().enumerate() {
        steps += b as u128;
        accepted += i as u128 * b as u128;
    }
    counters[2].is_some_and(|v| v as u128 != steps) || counters[0].is_some_and(|a| a as u128 != accepted)
}

/// Counters that break a bound no engine's counters can (docs/contract.md §3.5, revision 6,
/// `core.state.breaks_bound`), each where both are known: accepted > proposed,
/// verify > completion, accepted > completion.
fn breaks_bound(counters: [Option<u64>; 4]) -> bool {
    let above = |count: Option<u64>, bound: Option<u64>| matches!((count, bound), (Some(c), Some(b)) if c > b);
    above(counters[0], counters[1]) || above(counters[2], counters[3]) || above(counters[0], counters[3])
}

/// Sums and summed histogram of one group of non-conflicting generations.
type Group = (Sums, Option<Vec<u128>>);

fn add_group(into: &mut Group, from: &Group) {
    for (a, b) in into.0.iter_mut().zip(from.0) {
        *a += b;
    }
    if let Some(h) = &from.1 {
        add_bins(&mut into.1, h.len(), h.iter().copied());
    }
}

/// One key's sums in a partial's breakdown: (weight_version, task or draft lag, None when
/// unknown; sums, histogram).
pub type KeySums<K> = (Option<K>, Sums, Option<Vec<u128>>);

/// One breakdown (`core.state._breakdown`): per key (0: unknown) sorted by `name` of the key
/// (a string's bytes, a lag's number), unknown last; (empty, true) past `MAX_BREAKDOWN_KEYS`
/// known keys; empty when none is known.
fn breakdown<I: Copy + Eq + std::hash::Hash + Default, K: Ord>(
    groups: HashMap<I, Group>,
    name: impl Fn(I) -> K,
) -> (Vec<KeySums<K>>, bool) {
    let known = groups.keys().filter(|&&k| k != I::default()).count();
    if known > MAX_BREAKDOWN_KEYS {
        return (Vec::new(), true);
    }
    if known == 0 {
        return (Vec::new(), false);
    }
    let mut list: Vec<KeySums<K>> =
        groups.into_iter().map(|(k, (s, h))| ((k != I::default()).then(|| name(k)), s, h)).collect();
    list.sort_by(|a, b| match (&a.0, &b.0) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (Some(_), None) => std::cmp::Ordering::Less,
        (Some(x), Some(y)) => x.cmp(y),
    });
    (list, false)
}

/// The partial's sums (the Python layer adds markers and envelope fields).
pub struct Partial {
    pub occurrence_count: u64,
    pub unique_generation_count: u64,
    pub conflicting_generation_count: u64,
    pub sample_count: u64,
    pub totals: Sums,
    pub accept_histogram: Option<Vec<u128>>,
    pub accept_ratio_samples: u64,
    pub accept_ratio_parts: Vec<f64>,
    pub length_ratio_samples: u64,
    pub length_ratio_parts: Vec<f64>,
    /// (weight_version or None, sums, histogram), sorted, None last
    pub versions: Vec<KeySums<Vec<u8>>>,
    pub too_many_versions: bool,
    /// non-conflicting generations whose histogram contradicts their counters (§3.5)
    pub inconsistent_generation_count: u64,
    /// (task or None, sums, histogram), sorted, None last
    pub tasks: Vec<KeySums<Vec<u8>>>,
    pub too_many_tasks: bool,
    /// (revision 5) (draft lag or None, sums, histogram), in numeric order, None last
    pub draft_lags: Vec<KeySums<u64>>,
    pub too_many_draft_lags: bool,
    /// (revision 5) the spread of tokens per verify step (§3.7); None when no generation qualifies
    pub distribution: Option<Vec<u64>>,
}

/// The counters a delta compares against (`core.state.BatchState._counters`); markers
/// are compared by the Python layer.
#[derive(Clone, Default, PartialEq, Eq)]
struct Base {
    counts: [i64; 4],
    received: Vec<i64>,
    algorithms: usize,
    counters_seen: bool,
}

#[derive(Default)]
struct Journal {
    /// entries created since the last delta (flag NEW)
    new: Vec<u32>,
    /// older entries whose value changed (became conflicting)
    changed: Vec<u32>,
    /// occurrences added to entries beyond their first one (and first ones of restored entries)
    occurrences: Vec<(u32, u32)>,
    base: Base,
}

/// A value as a delta's wide entry holds it.
pub struct Restored<'a> {
    pub state_hash: Option<&'a [u8]>,
    pub counters: [Option<u64>; 4],
    pub hist: Option<Vec<u64>>,
    pub version: Option<&'a [u8]>,
    pub task: Option<&'a [u8]>,
    pub draft_lag: Option<u64>,
}

/// The fixed part of a delta: who it is for and the offsets it covers.
pub struct DeltaHeader<'a> {
    pub batch_id: &'a [u8],
    pub run_id: Option<&'a [u8]>,
    pub first_offset: i64,
    pub last_offset: i64,
    pub last_input_ms: i64,
}

#[derive(Default)]
pub struct State {
    hasher: DefaultHashBuilder,
    strings: Interner,
    gens: Vec<u8>,
    entries: Vec<Entry>,
    table: HashTable<u32>,
    /// state hashes and histograms (index 0 unused: "none")
    aux: Vec<Aux>,
    bins: Vec<u32>,
    big: HashMap<u32, Big>,
    extras: HashSet<(u32, u32)>,
    /// the ids of the last session, version, sample and task interned (records come in runs)
    last_ids: [(u32, u32); 4],
    labels: Labels,
    conflicts: u64,
    pub record_count: i64,
    pub invalid_record_count: i64,
    pub late_record_count: i64,
    pub conflicting_record_count: i64,
    /// per producer, in order of first delivery
    producers: Vec<(Vec<u8>, i64)>,
    producer_index: HashMap<Vec<u8>, usize>,
    /// speculative algorithms named, in order of first appearance
    algorithms: Vec<Vec<u8>>,
    pub counters_seen: bool,
    journal: Option<Journal>,
}

/// What a run of records did: (aggregated, redelivered, conflicting) records.
pub type Counts = (u64, u64, u64);

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn generation_count(&self) -> usize {
        self.entries.len()
    }

    /// Heap bytes held (for the memory benchmark).
    /// Give back the spare capacity of the growable arenas (a closed batch waiting out its
    /// grace takes no more new generations, so the slack of their last doubling is waste).
    pub fn shrink(&mut self) {
        self.gens.shrink_to_fit();
        self.entries.shrink_to_fit();
        self.aux.shrink_to_fit();
        self.bins.shrink_to_fit();
        self.strings.bytes.shrink_to_fit();
        self.strings.spans.shrink_to_fit();
    }

    pub fn heap_bytes(&self) -> usize {
        self.strings.heap_bytes()
            + self.gens.capacity()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.table.allocation_size()
            + self.aux.capacity() * std::mem::size_of::<Aux>()
            + self.bins.capacity() * 4
            + self.big.allocation_size()
            + self.big.values().map(|b| b.hist.as_ref().map_or(0, |h| h.len() * 8)).sum::<usize>()
            + self.extras.allocation_size()
            + self.labels.heap_bytes()
    }

    #[inline]
    fn gen_bytes(&self, e: &Entry) -> &[u8] {
        let off = (e.gen_hi as usize) << 32 | e.gen_off as usize;
        let len = (e.gen_len & !NEW) as usize;
        self.gens.get(off..off + len).unwrap_or(&[])
    }

    #[inline]
    fn key_hash(&self, session: u32, generation: &[u8]) -> u64 {
        self.hasher.hash_one((session, generation))
    }

    fn find(&self, session: u32, generation: &[u8]) -> Option<u32> {
        let hash = self.key_hash(session, generation);
        let (entries, gens) = (&self.entries, &self.gens);
        self.table
            .find(hash, |&i| {
                let e = &entries[i as usize];
                e.session == session && entry_gen(gens, e) == generation
            })
            .copied()
    }

    /// A new entry for (session, generation), with no value and no occurrence yet.
    fn create(&mut self, session: u32, generation: &[u8]) -> Result<u32, TooLarge> {
        if generation.len() > MAX_GEN_LEN {
            return Err(TooLarge("a generation_id longer than 32767 bytes"));
        }
        let idx = u32::try_from(self.entries.len()).map_err(|_| TooLarge("too many generations in one batch"))?;
        let off = self.gens.len();
        if off >> 40 != 0 {
            return Err(TooLarge("more than 1 TiB of generation ids in one batch"));
        }
        self.gens.extend_from_slice(generation);
        self.entries.push(Entry {
            gen_off: off as u32,
            gen_hi: (off >> 32) as u8,
            gen_len: generation.len() as u16,
            session,
            flags: NO_OCC,
            ..Entry::default()
        });
        let hash = self.key_hash(session, generation);
        let (entries, gens, hasher) = (&self.entries, &self.gens, &self.hasher);
        self.table.insert_unique(hash, idx, |&i| {
            let e = &entries[i as usize];
            hasher.hash_one((e.session, entry_gen(gens, e)))
        });
        Ok(idx)
    }

    // -- values ----------------------------------------------------------------------------
    #[inline]
    fn counter(&self, idx: u32, e: &Entry, i: usize) -> Option<u64> {
        if e.flags & KNOWN[i] == 0 {
            return None;
        }
        if e.flags & BIG != 0 {
            return self.big.get(&idx).map(|b| b.counters[i]);
        }
        Some(e.counters[i] as u64)
    }

    #[inline]
    fn counters_of(&self, idx: u32) -> [Option<u64>; 4] {
        let e = &self.entries[idx as usize];
        [0, 1, 2, 3].map(|i| self.counter(idx, e, i))
    }

    #[inline]
    fn state_hash_of(&self, e: &Entry) -> u32 {
        if e.aux == 0 {
            0
        } else {
            self.aux.get(e.aux as usize).map_or(0, |a| a.state_hash)
        }
    }

    #[inline]
    fn hist_of(&self, idx: u32, e: &Entry) -> Option<Hist<'_>> {
        if e.flags & BIG != 0 {
            return self.big.get(&idx).and_then(|b| b.hist.as_deref()).map(Hist::Wide);
        }
        if e.aux == 0 {
            return None;
        }
        let a = self.aux.get(e.aux as usize)?;
        if a.hist_len == NO_HIST {
            return None;
        }
        let start = a.hist_off as usize;
        self.bins.get(start..start + a.hist_len as usize).map(Hist::Small)
    }

    /// Stores `value` as the entry's (conflict flag cleared).
    fn set_value(&mut self, idx: u32, value: &Value) -> Result<(), TooLarge> {
        let small = |v: u64| v <= u32::MAX as u64;
        let fits = value.counters.iter().all(|c| c.is_none_or(small))
            && value.hist.is_none_or(|h| h.iter().all(|&b| small(b)));
        if self.entries[idx as usize].flags & BIG != 0 {
            self.big.remove(&idx);
        }
        let mut aux = 0;
        if value.state_hash != 0 || (fits && value.hist.is_some()) {
            let (hist_off, hist_len) = match value.hist {
                Some(h) if fits => {
                    let off = u32::try_from(self.bins.len()).map_err(|_| TooLarge("4G histogram bins in one batch"))?;
                    self.bins.extend(h.iter().map(|&b| b as u32));
                    (off, h.len() as u32)
                }
                _ => (0, NO_HIST),
            };
            aux = u32::try_from(self.aux.len().max(1)).map_err(|_| TooLarge("too many histograms in one batch"))?;
            if self.aux.is_empty() {
                self.aux.push(Aux::default()); // index 0: none
            }
            self.aux.push(Aux { state_hash: value.state_hash, hist_off, hist_len });
        }
        if !fits {
            let counters = value.counters.map(|c| c.unwrap_or(0));
            self.big.insert(idx, Big { counters, hist: value.hist.map(Box::from) });
        }
        let e = &mut self.entries[idx as usize];
        e.flags &= !(KNOWN[0] | KNOWN[1] | KNOWN[2] | KNOWN[3] | CONFLICT | BIG);
        if !fits {
            e.flags |= BIG;
        }
        e.label = value.label;
        e.aux = aux;
        for (i, (slot, known)) in e.counters.iter_mut().zip(KNOWN).enumerate() {
            *slot = 0;
            if let Some(v) = value.counters[i] {
                e.flags |= known;
                if fits {
                    *slot = v as u32;
                }
            }
        }
        Ok(())
    }

    fn set_conflict(&mut self, idx: u32) {
        let e = &mut self.entries[idx as usize];
        if e.flags & BIG != 0 {
            self.big.remove(&idx);
        }
        e.flags = (e.flags & (MULTI | NO_OCC)) | CONFLICT;
        e.counters = [0; 4];
        e.label = 0;
        e.aux = 0; // the old state hash and bins stay in their arenas, unused
    }

    /// Whether the entry holds `value` (not conflicting).
    fn holds(&self, idx: u32, value: &Value) -> bool {
        let e = &self.entries[idx as usize];
        e.flags & CONFLICT == 0
            && e.label == value.label
            && self.counters_of(idx) == value.counters
            && self.state_hash_of(e) == value.state_hash
            && match (self.hist_of(idx, e), value.hist) {
                (None, None) => true,
                (Some(stored), Some(h)) => stored.same(h),
                _ => false,
            }
    }

    /// Adds occurrence (idx, sample); false when it was already there.
    fn add_occurrence(&mut self, idx: u32, sample: u32) -> bool {
        let e = &mut self.entries[idx as usize];
        if e.flags & NO_OCC != 0 {
            e.flags &= !NO_OCC;
            e.sample = sample;
            return true;
        }
        if e.sample == sample {
            return false;
        }
        if e.flags & MULTI != 0 && self.extras.contains(&(idx, sample)) {
            return false;
        }
        e.flags |= MULTI;
        self.extras.insert((idx, sample));
        true
    }

    /// `intern_opt` through a one-entry cache per kind (0: session, 1: version, 2: sample, 3: task).
    #[inline]
    fn intern_cached(&mut self, kind: usize, s: Option<&[u8]>) -> Result<u32, TooLarge> {
        let Some(s) = s else {
            return Ok(0);
        };
        let (id, len) = self.last_ids[kind];
        if id != 0 && len as usize == s.len() && self.strings.resolve(id) == s {
            return Ok(id);
        }
        let id = self.strings.intern(&self.hasher, s)?;
        self.last_ids[kind] = (id, s.len() as u32);
        Ok(id)
    }

    fn intern_opt(&mut self, s: Option<&[u8]>) -> Result<u32, TooLarge> {
        match s {
            Some(s) => self.strings.intern(&self.hasher, s),
            None => Ok(0),
        }
    }

    // -- the rule --------------------------------------------------------------------------
    /// Applies one valid record: the dedup and conflict rule (docs/contract.md §3).
    /// Returns (aggregated: a new occurrence, conflicting: its key is conflicting).
    pub fn apply(&mut self, r: &Record) -> Result<(bool, bool), TooLarge> {
        if r.counters[0].is_some() || r.counters[1].is_some() || r.counters[2].is_some() {
            self.counters_seen = true;
        }
        let session = self.intern_cached(0, Some(r.session))?;
        let version = self.intern_cached(1, r.version)?;
        let sample = self.intern_cached(2, r.sample)?;
        let task = self.intern_cached(3, r.task)?;
        let label = self.labels.label(version, task, r.draft_lag)?;
        let journaling = self.journal.is_some();
        let Some(idx) = self.find(session, r.generation) else {
            let idx = self.create(session, r.generation)?;
            let state_hash = self.intern_opt(r.state_hash)?;
            self.set_value(idx, &Value { state_hash, counters: r.counters, hist: r.hist, label })?;
            let e = &mut self.entries[idx as usize];
            e.flags &= !NO_OCC;
            e.sample = sample;
            if let Some(journal) = self.journal.as_mut() {
                e.gen_len |= NEW;
                journal.new.push(idx);
            }
            return Ok((true, false));
        };
        let flags = self.entries[idx as usize].flags;
        let mut conflicting = false;
        if flags & CONFLICT != 0 {
            conflicting = true;
        } else {
            let state_hash = match r.state_hash {
                Some(h) => self.strings.get(&self.hasher, h).unwrap_or(u32::MAX),
                None => 0,
            };
            if !self.holds(idx, &Value { state_hash, counters: r.counters, hist: r.hist, label }) {
                self.set_conflict(idx);
                self.conflicts += 1;
                conflicting = true;
                if journaling && self.entries[idx as usize].gen_len & NEW == 0 {
                    if let Some(journal) = self.journal.as_mut() {
                        journal.changed.push(idx);
                    }
                }
            }
        }
        let aggregated = self.add_occurrence(idx, sample);
        if aggregated && journaling {
            if let Some(journal) = self.journal.as_mut() {
                journal.occurrences.push((idx, sample));
            }
        }
        Ok((aggregated, conflicting))
    }

    /// Applies a run of valid records and counts their deliveries; `producer(i)` is
    /// whose delivery record i is (its own producer_id, else the envelope's).
    pub fn apply_many<'a>(
        &mut self,
        n: usize,
        late: bool,
        mut record: impl FnMut(usize) -> (Record<'a>, Option<&'a [u8]>),
    ) -> Result<Counts, TooLarge> {
        let (mut aggregated, mut redelivered, mut conflicting) = (0u64, 0u64, 0u64);
        let mut producer: Option<&[u8]> = None;
        let mut produced = 0i64;
        let mut result = Ok(());
        let mut done = 0usize;
        for i in 0..n {
            let (r, record_producer) = record(i);
            if record_producer != producer {
                if let Some(p) = producer {
                    self.count_received(p, produced);
                }
                producer = record_producer;
                produced = 0;
            }
            match self.apply(&r) {
                Ok((new, conflict)) => {
                    produced += 1;
                    done += 1;
                    if new {
                        aggregated += 1;
                    } else {
                        redelivered += 1;
                    }
                    if conflict {
                        conflicting += 1;
                    }
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if let Some(p) = producer {
            self.count_received(p, produced);
        }
        self.record_count += done as i64;
        if late {
            self.late_record_count += done as i64;
        }
        self.conflicting_record_count += conflicting as i64;
        result.map(|_| (aggregated, redelivered, conflicting))
    }

    pub fn count_received(&mut self, producer: &[u8], n: i64) {
        if n == 0 {
            return;
        }
        match self.producer_index.get(producer) {
            Some(&i) => self.producers[i].1 += n,
            None => {
                self.producer_index.insert(producer.to_vec(), self.producers.len());
                self.producers.push((producer.to_vec(), n));
            }
        }
    }

    pub fn add_invalid(&mut self, producer: Option<&[u8]>, late: bool) {
        self.record_count += 1;
        self.invalid_record_count += 1;
        if late {
            self.late_record_count += 1;
        }
        if let Some(p) = producer {
            self.count_received(p, 1);
        }
    }

    pub fn add_algorithm(&mut self, name: &[u8]) {
        if !name.is_empty() && !self.algorithms.iter().any(|a| a == name) {
            self.algorithms.push(name.to_vec());
        }
    }

    pub fn algorithms_sorted(&self) -> Vec<&[u8]> {
        let mut out: Vec<&[u8]> = self.algorithms.iter().map(|a| a.as_slice()).collect();
        out.sort();
        out
    }

    pub fn received(&self) -> impl Iterator<Item = (&[u8], i64)> {
        self.producers.iter().map(|(p, n)| (p.as_slice(), *n))
    }

    // -- durability ------------------------------------------------------------------------
    fn base_now(&self) -> Base {
        Base {
            counts: [
                self.record_count,
                self.invalid_record_count,
                self.late_record_count,
                self.conflicting_record_count,
            ],
            received: self.producers.iter().map(|p| p.1).collect(),
            algorithms: self.algorithms.len(),
            counters_seen: self.counters_seen,
        }
    }

    pub fn start_journal(&mut self) {
        for idx in self.journal.take().map(|j| j.new).unwrap_or_default() {
            self.entries[idx as usize].gen_len &= !NEW;
        }
        self.journal = Some(Journal { base: self.base_now(), ..Journal::default() });
    }

    pub fn journaling(&self) -> bool {
        self.journal.is_some()
    }

    /// A counters value in the packed delta layout of `core.state` (each + 1, 0: unknown;
    /// 20/20/20/24 bits), when the entry has that form: created since the last delta,
    /// one occurrence, no state hash, no histogram, no task, no draft lag, no conflict, small counters.
    fn packed_counters(&self, idx: u32) -> Option<u128> {
        let e = &self.entries[idx as usize];
        if e.flags & (CONFLICT | BIG | MULTI | NO_OCC) != 0 || e.aux != 0 || e.label & TASKED != 0 {
            return None;
        }
        let mut out = 0u128;
        for (i, (shift, bits)) in [(0u32, 20u32), (20, 20), (40, 20), (60, 24)].into_iter().enumerate() {
            if let Some(v) = self.counter(idx, e, i) {
                let plus = v as u128 + 1;
                if plus >= 1 << bits {
                    return None;
                }
                out |= plus << shift;
            }
        }
        Some(out)
    }

    /// A wide entry: ten items, eleven when the value names a task, twelve when it names a
    /// draft lag (as `core.state` writes it).
    fn write_value(&self, w: &mut Writer, idx: u32) {
        let e = &self.entries[idx as usize];
        let session = self.strings.resolve(e.session);
        let (version, task, lag) = self.labels.parts(e.label);
        let items = match (e.flags & CONFLICT != 0, task, lag) {
            (true, _, _) => 10,
            (false, _, 1..) => 12,
            (false, 1.., 0) => 11,
            _ => 10,
        };
        w.array(items);
        w.str(session);
        w.str(self.gen_bytes(e));
        if e.flags & CONFLICT != 0 {
            w.bool(true);
            for _ in 0..7 {
                w.nil();
            }
            return;
        }
        w.bool(false);
        let state_hash = self.state_hash_of(e);
        w.opt_str((state_hash != 0).then(|| self.strings.resolve(state_hash)));
        for i in 0..4 {
            match self.counter(idx, e, i) {
                Some(c) => w.uint(c),
                None => w.nil(),
            }
        }
        match self.hist_of(idx, e) {
            Some(h) => {
                w.array(h.len());
                for b in h.values() {
                    w.uint(b);
                }
            }
            None => w.nil(),
        }
        w.opt_str((version != 0).then(|| self.strings.resolve(version)));
        if items > 10 {
            w.opt_str((task != 0).then(|| self.strings.resolve(task)));
        }
        if items > 11 {
            w.uint(lag - 1);
        }
    }

    fn write_occurrence(&self, w: &mut Writer, idx: u32, sample: u32) {
        let e = &self.entries[idx as usize];
        w.array(3);
        w.str(self.strings.resolve(e.session));
        w.opt_str((sample != 0).then(|| self.strings.resolve(sample)));
        w.str(self.gen_bytes(e));
    }

    /// The changes since the last delta as a msgpack `BatchDelta` (streams/_layout.py:
    /// an array of its fields in order), `markers` the encoded array of changed
    /// markers; None when nothing changed. Resets the journal.
    pub fn take_delta(&mut self, h: &DeltaHeader, markers: Option<&[u8]>) -> Option<Vec<u8>> {
        let journal = self.journal.as_ref()?;
        let now = self.base_now();
        let base = &journal.base;
        if journal.new.is_empty()
            && journal.changed.is_empty()
            && journal.occurrences.is_empty()
            && now == *base
            && markers.is_none()
        {
            return None;
        }
        let mut packed: Vec<(u32, u128)> = Vec::new();
        let mut versioned: Vec<(u32, u128)> = Vec::new();
        let mut wide: Vec<u32> = Vec::new();
        for &idx in &journal.new {
            match self.packed_counters(idx) {
                Some(c) if self.entries[idx as usize].label != 0 => versioned.push((idx, c)),
                Some(c) => packed.push((idx, c)),
                None => wide.push(idx),
            }
        }
        let mut w = Writer::default();
        w.array(17);
        w.str(h.batch_id);
        w.int(h.first_offset);
        w.int(h.last_offset);
        w.int(h.last_input_ms);
        // entries
        w.array(wide.len() + journal.changed.len());
        for &idx in wide.iter().chain(journal.changed.iter()) {
            self.write_value(&mut w, idx);
        }
        // occurrences: the first of each new entry written wide, then the added ones
        let firsts: Vec<u32> = wide.iter().copied().filter(|&i| self.entries[i as usize].flags & NO_OCC == 0).collect();
        w.array(firsts.len() + journal.occurrences.len());
        for &idx in &firsts {
            self.write_occurrence(&mut w, idx, self.entries[idx as usize].sample);
        }
        for &(idx, sample) in &journal.occurrences {
            self.write_occurrence(&mut w, idx, sample);
        }
        for i in 0..4 {
            w.int(now.counts[i] - base.counts[i]);
        }
        let changed: Vec<(usize, i64)> = now
            .received
            .iter()
            .enumerate()
            .filter_map(|(i, &n)| {
                let before = base.received.get(i).copied().unwrap_or(0);
                // a producer first seen with 0 deliveries is as absent as in Python's dict
                (n != before).then_some((i, n - before))
            })
            .collect();
        w.map(changed.len());
        for (i, n) in changed {
            w.str(&self.producers[i].0);
            w.int(n);
        }
        match markers {
            Some(raw) => w.raw(raw),
            None => w.array(0),
        }
        let mut new_algorithms: Vec<&[u8]> = self.algorithms[base.algorithms.min(self.algorithms.len())..]
            .iter()
            .map(|a| a.as_slice())
            .collect();
        new_algorithms.sort();
        w.array(new_algorithms.len());
        for a in new_algorithms {
            w.str(a);
        }
        w.bool(now.counters_seen && !base.counters_seen);
        w.array(packed.len() * 5);
        for &(idx, c) in &packed {
            self.write_packed(&mut w, idx, c);
        }
        w.opt_str(h.run_id);
        w.array(versioned.len() * 6);
        for &(idx, c) in &versioned {
            self.write_packed(&mut w, idx, c);
            w.str(self.strings.resolve(self.labels.parts(self.entries[idx as usize].label).0));
        }
        // reset
        let new = std::mem::take(&mut self.journal.as_mut()?.new);
        for idx in new {
            self.entries[idx as usize].gen_len &= !NEW;
        }
        self.journal = Some(Journal { base: now, ..Journal::default() });
        Some(w.out)
    }

    fn write_packed(&self, w: &mut Writer, idx: u32, counters: u128) {
        let e = &self.entries[idx as usize];
        w.str(self.strings.resolve(e.session));
        w.str(self.gen_bytes(e));
        w.opt_str((e.sample != 0).then(|| self.strings.resolve(e.sample)));
        w.uint(counters as u64);
        w.uint((counters >> 64) as u64);
    }

    // -- restore ---------------------------------------------------------------------------
    fn entry_for(&mut self, session: &[u8], generation: &[u8]) -> Result<(u32, bool), TooLarge> {
        let session = self.strings.intern(&self.hasher, session)?;
        match self.find(session, generation) {
            Some(idx) => Ok((idx, false)),
            None => Ok((self.create(session, generation)?, true)),
        }
    }

    /// An entry a delta wrote in packed form (`core.state._packed_entries` reads it): new when it
    /// was written; if it is not new after all, the conflict rule applies.
    pub fn restore_packed(
        &mut self,
        session: &[u8],
        generation: &[u8],
        sample: Option<&[u8]>,
        counters: u128,
        version: Option<&[u8]>,
    ) -> Result<(), TooLarge> {
        let (idx, new) = self.entry_for(session, generation)?;
        let sample = self.intern_opt(sample)?;
        let version = self.intern_opt(version)?;
        let label = self.labels.label(version, 0, None)?;
        let mut values = [None; 4];
        for (i, (shift, bits)) in [(0u32, 20u32), (20, 20), (40, 20), (60, 24)].into_iter().enumerate() {
            let plus = (counters >> shift) & ((1 << bits) - 1);
            if plus != 0 {
                values[i] = Some((plus - 1) as u64);
            }
        }
        let value = Value { state_hash: 0, counters: values, hist: None, label };
        if new {
            self.set_value(idx, &value)?;
        } else if self.entries[idx as usize].flags & CONFLICT == 0 && !self.holds(idx, &value) {
            self.set_conflict(idx);
            self.conflicts += 1;
        }
        self.add_occurrence(idx, sample);
        Ok(())
    }

    /// A wide entry of a delta: its value (None: conflicting) replaces what is held.
    pub fn restore_entry(&mut self, session: &[u8], generation: &[u8], value: Option<Restored>) -> Result<(), TooLarge> {
        let (idx, _) = self.entry_for(session, generation)?;
        let Some(v) = value else {
            if self.entries[idx as usize].flags & CONFLICT == 0 {
                self.conflicts += 1;
            }
            self.set_conflict(idx);
            return Ok(());
        };
        let state_hash = self.intern_opt(v.state_hash)?;
        let version = self.intern_opt(v.version)?;
        let task = self.intern_opt(v.task)?;
        let label = self.labels.label(version, task, v.draft_lag)?;
        self.set_value(idx, &Value { state_hash, counters: v.counters, hist: v.hist.as_deref(), label })
    }

    pub fn restore_occurrence(&mut self, session: &[u8], sample: Option<&[u8]>, generation: &[u8]) -> Result<(), TooLarge> {
        let (idx, _) = self.entry_for(session, generation)?;
        let sample = self.intern_opt(sample)?;
        self.add_occurrence(idx, sample);
        Ok(())
    }

    pub fn restore_counts(&mut self, counts: [i64; 4], counters_seen: bool) {
        self.record_count += counts[0];
        self.invalid_record_count += counts[1];
        self.late_record_count += counts[2];
        self.conflicting_record_count += counts[3];
        self.counters_seen |= counters_seen;
    }

    /// After a restore: the journal's base is what is held now.
    pub fn rebase_journal(&mut self) {
        let now = self.base_now();
        if let Some(journal) = self.journal.as_mut() {
            journal.base = now;
        }
    }

    // -- output ----------------------------------------------------------------------------
    /// This partition's sums for the batch (`core.state.BatchState.partial`).
    pub fn partial(&self) -> Partial {
        let mut totals: Group = ([0; 11], None);
        let mut inconsistent_count = 0u64;
        let mut distribution: Option<Vec<u64>> = None;
        // per label, then per version, task and lag from the labels' sums (a batch has few labels)
        let mut by_label: HashMap<u32, Group> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            if e.flags & CONFLICT != 0 {
                continue;
            }
            let idx = i as u32;
            let counters = [0, 1, 2, 3].map(|k| self.counter(idx, e, k));
            let group = by_label.entry(e.label).or_insert(([0; 11], None));
            add_counters(&mut group.0, counters);
            let mut contradicted = breaks_bound(counters);
            if let Some(h) = self.hist_of(idx, e) {
                add_bins(&mut group.1, h.len(), h.values().map(u128::from));
                contradicted = contradicted || inconsistent(counters, h);
            }
            inconsistent_count += contradicted as u64;
            if let (Some(verify @ 1..), Some(completion)) = (counters[2], counters[3]) {
                // floor(4 * completion / verify) - 4, clamped to the buckets (§3.7)
                let bucket = (4 * completion as u128 / verify as u128).saturating_sub(4);
                let bucket = bucket.min(DISTRIBUTION_BUCKETS as u128 - 1) as usize;
                distribution.get_or_insert_with(|| vec![0; DISTRIBUTION_BUCKETS])[bucket] += 1;
            }
        }
        let mut by_version: HashMap<u32, Group> = HashMap::new();
        let mut by_task: HashMap<u32, Group> = HashMap::new();
        let mut by_lag: HashMap<u64, Group> = HashMap::new();
        for (&label, group) in &by_label {
            let (version, task, lag) = self.labels.parts(label);
            add_group(&mut totals, group);
            add_group(by_version.entry(version).or_insert(([0; 11], None)), group);
            add_group(by_task.entry(task).or_insert(([0; 11], None)), group);
            add_group(by_lag.entry(lag).or_insert(([0; 11], None)), group);
        }
        let (totals, hist) = totals;
        // samples: (session, sample) or, for sample_id None, the generation itself
        let sample_key = |idx: u32, sample: u32| -> (u32, u32, bool) {
            if sample != 0 {
                (self.entries[idx as usize].session, sample, true)
            } else {
                (idx, 0, false)
            }
        };
        let occurrences = || {
            self.entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.flags & NO_OCC == 0)
                .map(|(i, e)| (i as u32, e.sample))
                .chain(self.extras.iter().copied())
        };
        let occurrence_count =
            self.entries.iter().filter(|e| e.flags & NO_OCC == 0).count() as u64 + self.extras.len() as u64;
        let (mut accept_samples, mut length_samples) = (0u64, 0u64);
        let (mut accept_parts, mut length_parts) = (Vec::new(), Vec::new());
        let sample_count;
        // The aliases are suppressed by any conflict or invalid record anywhere; this
        // partition's share is only worth folding when it has neither.
        if self.conflicts == 0 && self.invalid_record_count == 0 {
            // per sample, its counters over its distinct generations: known only if
            // known for every one of them (the fold of docs/contract.md §2)
            let mut folds: HashMap<(u32, u32, bool), [Option<u128>; 4]> = HashMap::new();
            for (idx, sample) in occurrences() {
                let counters = self.counters_of(idx).map(|c| c.map(|v| v as u128));
                folds
                    .entry(sample_key(idx, sample))
                    .and_modify(|f| {
                        for k in 0..4 {
                            f[k] = match (f[k], counters[k]) {
                                (Some(a), Some(b)) => Some(a + b),
                                _ => None,
                            };
                        }
                    })
                    .or_insert(counters);
            }
            sample_count = folds.len() as u64;
            let (mut accept, mut length) = (Vec::new(), Vec::new());
            for f in folds.values() {
                if let (Some(a), Some(p)) = (f[0], f[1]) {
                    if p > 0 {
                        accept.push(div(a, p));
                    }
                }
                if let (Some(v), Some(c)) = (f[2], f[3]) {
                    if v > 0 {
                        length.push(div(c, v));
                    }
                }
            }
            // grown in sorted order, the expansion depends only on the ratios, not on
            // the order the hash tables hold the samples in (live or restored alike)
            accept.sort_by(f64::total_cmp);
            length.sort_by(f64::total_cmp);
            (accept_samples, length_samples) = (accept.len() as u64, length.len() as u64);
            for x in accept {
                grow(&mut accept_parts, x);
            }
            for x in length {
                grow(&mut length_parts, x);
            }
        } else {
            let samples: HashSet<(u32, u32, bool)> = occurrences().map(|(i, s)| sample_key(i, s)).collect();
            sample_count = samples.len() as u64;
        }
        accept_parts.retain(|&p| p != 0.0);
        length_parts.retain(|&p| p != 0.0);
        let string = |id: u32| self.strings.resolve(id).to_vec();
        let (versions, too_many_versions) = breakdown(by_version, string);
        let (tasks, too_many_tasks) = breakdown(by_task, string);
        let (draft_lags, too_many_draft_lags) = breakdown(by_lag, |lag: u64| lag - 1);
        Partial {
            occurrence_count,
            unique_generation_count: self.entries.len() as u64,
            conflicting_generation_count: self.conflicts,
            sample_count,
            totals,
            accept_histogram: hist,
            accept_ratio_samples: accept_samples,
            accept_ratio_parts: accept_parts,
            length_ratio_samples: length_samples,
            length_ratio_parts: length_parts,
            versions,
            too_many_versions,
            inconsistent_generation_count: inconsistent_count,
            tasks,
            too_many_tasks,
            draft_lags,
            too_many_draft_lags,
            distribution,
        }
    }
}

#[inline]
fn entry_gen<'a>(gens: &'a [u8], e: &Entry) -> &'a [u8] {
    let off = (e.gen_hi as usize) << 32 | e.gen_off as usize;
    let len = (e.gen_len & !NEW) as usize;
    gens.get(off..off + len).unwrap_or(&[])
}
