//! `specmeter.streams.core._native`: the stage-1 core in Rust, behind the same Python API
//! as the pure-Python reference (streams/_state.py): `decode(data, max_bytes)` and
//! `BatchState`. The hot path -- a records message's bytes applied to a batch's state
//! -- creates no Python object per record.
//!
//! No panic crosses into Python: `decode` answers None (the Python decoder takes the
//! message) and every other entry point raises a RuntimeError that says what to do.

mod compress;
mod core;
mod wire;
mod exact;
mod msgpack;

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::core::{DeltaHeader, KeySums, Record, Restored, State, TooLarge};
use crate::wire::Parsed;

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

/// Runs `f`; a panic becomes a RuntimeError (PyO3's PanicException is a
/// BaseException, which would stop the worker instead of dead-lettering one input).
fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(PyRuntimeError::new_err(format!(
            "specmeter's native core failed ({}); this is a bug, please report it. \
             Set SPECMETER_NO_NATIVE=1 to run the Python core meanwhile",
            panic_message(payload.as_ref())
        ))),
    }
}

fn too_large(e: TooLarge) -> PyErr {
    PyValueError::new_err(format!(
        "{} is more than the native core holds; set SPECMETER_NO_NATIVE=1 to use the Python core",
        e.0
    ))
}

fn text(bytes: &[u8]) -> &str {
    // every stored string came in as valid UTF-8 (a Python str or a validated message)
    std::str::from_utf8(bytes).unwrap_or("\u{fffd}")
}

fn opt_text<'py>(py: Python<'py>, bytes: Option<&[u8]>) -> Bound<'py, PyAny> {
    match bytes {
        Some(b) => PyString::new(py, text(b)).into_any(),
        None => py.None().into_bound(py),
    }
}

// -- decoding ----------------------------------------------------------------------------
/// One records-topic message, parsed by the native decoder: its batches (groups of
/// records), the envelope's producer and run. Every record in it is valid.
#[pyclass(module = "specmeter.streams.core._native", frozen)]
struct Decoded {
    data: Py<PyBytes>,
    parsed: Parsed,
}

#[pymethods]
impl Decoded {
    /// ``[((run_id, batch_id), record count), ...]``, one per batch run in the message.
    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let data = self.data.bind(py).as_bytes();
        let items = self
            .parsed
            .groups
            .iter()
            .map(|g| {
                let key = PyTuple::new(
                    py,
                    [opt_text(py, g.run.map(|s| s.get(data))), PyString::new(py, text(g.batch_id.get(data))).into_any()],
                )?;
                PyTuple::new(py, [key.into_any(), g.count.into_pyobject(py)?.into_any()])
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    #[getter]
    fn producer_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        opt_text(py, self.parsed.producer.map(|s| s.get(self.data.bind(py).as_bytes())))
    }

    #[getter]
    fn run_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        opt_text(py, self.parsed.run.map(|s| s.get(self.data.bind(py).as_bytes())))
    }

    /// Always empty: a message with an invalid part is decoded by Python.
    #[getter]
    fn invalid<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        PyList::empty(py)
    }

    /// Always None: markers are decoded by Python.
    #[getter]
    fn marker<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        py.None().into_bound(py)
    }

    /// The records ``start:stop`` of a group as ``GenerationRecord`` objects (for
    /// dead letters and the Python core; the hot path never calls this).
    #[pyo3(signature = (group, start=0, stop=None))]
    fn records<'py>(&self, py: Python<'py>, group: usize, start: usize, stop: Option<usize>) -> PyResult<Bound<'py, PyList>> {
        let (first, count) = self.slice(group, start, stop)?;
        let decoder = py.import("specmeter.schemas._codec")?.getattr("_record_decoder")?;
        let data = self.data.bind(py).as_bytes();
        let out = PyList::empty(py);
        for rec in &self.parsed.records[first..first + count] {
            let raw = data.get(rec.raw_start as usize..rec.raw_end as usize).unwrap_or(&[]);
            out.append(decoder.call_method1("decode", (PyBytes::new(py, raw),))?)?;
        }
        Ok(out)
    }

    fn __len__(&self) -> usize {
        self.parsed.records.len()
    }

    /// The fields of record ``index`` as the native core parsed them (for tests that
    /// hold them against msgspec's): ``(batch_id, session_id, generation_id, sample_id,
    /// state_hash, accepted, proposed, verify, completion, accept_histogram,
    /// producer_id, weight_version, run_id, task, draft_lag)``.
    fn _fields<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyTuple>> {
        let r = self
            .parsed
            .records
            .get(index)
            .ok_or_else(|| PyValueError::new_err(format!("no record {index} in this message")))?;
        let data = self.data.bind(py).as_bytes();
        let s = |span: Option<crate::msgpack::Span>| opt_text(py, span.map(|x| x.get(data)));
        let mut items = vec![s(Some(r.batch_id)), s(Some(r.session)), s(Some(r.generation)), s(r.sample), s(r.state_hash)];
        for c in r.counters {
            items.push(c.into_pyobject(py)?.into_any());
        }
        items.push(match r.hist {
            Some((f, n)) => {
                PyList::new(py, self.parsed.bins.get(f as usize..(f + n) as usize).unwrap_or(&[]).iter().copied())?
                    .into_any()
            }
            None => py.None().into_bound(py),
        });
        items.extend([s(r.producer), s(r.version), s(r.run), s(r.task)]);
        items.push(r.draft_lag.into_pyobject(py)?.into_any());
        PyTuple::new(py, items)
    }
}

impl Decoded {
    /// (index of the first record, count) of ``group[start:stop]``.
    fn slice(&self, group: usize, start: usize, stop: Option<usize>) -> PyResult<(usize, usize)> {
        let g = self
            .parsed
            .groups
            .get(group)
            .ok_or_else(|| PyValueError::new_err(format!("no group {group} in this message")))?;
        let count = g.count as usize;
        let stop = stop.unwrap_or(count).min(count);
        let start = start.min(stop);
        Ok((g.start as usize + start, stop - start))
    }
}

/// Parses one records-topic message; None when the Python decoder must take it
/// (anything but a clean, valid record or packed batch, or larger than ``max_bytes``).
#[pyfunction]
#[pyo3(signature = (data, max_bytes=None))]
fn decode(py: Python<'_>, data: &Bound<'_, PyAny>, max_bytes: Option<usize>) -> Option<Decoded> {
    let bytes = data.cast::<PyBytes>().ok()?;
    let raw = bytes.as_bytes();
    if max_bytes.is_some_and(|m| raw.len() > m) {
        return None;
    }
    let parsed = catch_unwind(|| wire::parse(raw)).ok().flatten()?;
    let _ = py;
    Some(Decoded { data: bytes.clone().unbind(), parsed })
}

// -- the state ---------------------------------------------------------------------------
/// Reads a counter of a Python record (None: unknown).
fn counter_of(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<u64>> {
    let value = obj.getattr(name)?;
    if value.is_none() {
        return Ok(None);
    }
    value.extract::<u64>().map(Some).map_err(|_| {
        PyValueError::new_err(format!("{name} must be an int from 0 to 2**64-1 (got {value}) for the native core"))
    })
}

fn opt_string(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Option<String>> {
    let value = obj.getattr(name)?;
    if value.is_none() {
        Ok(None)
    } else {
        Ok(Some(value.extract::<String>()?))
    }
}

/// A GenerationRecord's fields, owned (the Python-object path).
struct OwnedRecord {
    session: String,
    generation: String,
    sample: Option<String>,
    state_hash: Option<String>,
    counters: [Option<u64>; 4],
    hist: Option<Vec<u64>>,
    producer: Option<String>,
    version: Option<String>,
    task: Option<String>,
    draft_lag: Option<u64>,
}

impl OwnedRecord {
    fn read(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let hist = obj.getattr("accept_histogram")?;
        Ok(OwnedRecord {
            session: obj.getattr("session_id")?.extract()?,
            generation: obj.getattr("generation_id")?.extract()?,
            sample: opt_string(obj, "sample_id")?,
            state_hash: opt_string(obj, "state_hash")?,
            counters: [
                counter_of(obj, "accepted")?,
                counter_of(obj, "proposed")?,
                counter_of(obj, "verify")?,
                counter_of(obj, "completion")?,
            ],
            hist: if hist.is_none() { None } else { Some(hist.extract::<Vec<u64>>()?) },
            producer: opt_string(obj, "producer_id")?,
            version: opt_string(obj, "weight_version")?,
            task: opt_string(obj, "task")?,
            draft_lag: counter_of(obj, "draft_lag")?,
        })
    }

    fn view(&self) -> Record<'_> {
        Record {
            session: self.session.as_bytes(),
            generation: self.generation.as_bytes(),
            sample: self.sample.as_deref().map(str::as_bytes),
            state_hash: self.state_hash.as_deref().map(str::as_bytes),
            counters: self.counters,
            hist: self.hist.as_deref(),
            version: self.version.as_deref().map(str::as_bytes),
            task: self.task.as_deref().map(str::as_bytes),
            draft_lag: self.draft_lag,
        }
    }
}

/// Everything one partition knows about one batch: the native twin of
/// ``specmeter.streams.core.state.BatchState`` (same methods, same results).
#[pyclass(module = "specmeter.streams.core._native", name = "BatchState")]
struct BatchState {
    core: State,
    #[pyo3(get)]
    batch_id: Py<PyString>,
    #[pyo3(get)]
    run_id: Option<Py<PyString>>,
    /// producer_id -> its latest BatchMarker
    markers: Py<PyDict>,
    /// the markers as of the last delta
    markers_base: Option<Py<PyDict>>,
    /// records seen when ``compact`` last ran (``compacted`` while none came since)
    compacted_at: Option<i64>,
}

impl BatchState {
    fn seen(&self) -> i64 {
        self.core.record_count + self.core.invalid_record_count
    }

    fn apply_owned(&mut self, records: &[OwnedRecord], late: bool, producer_id: Option<&str>) -> PyResult<(u64, u64, u64)> {
        let envelope = producer_id.map(str::as_bytes);
        self.core
            .apply_many(records.len(), late, |i| {
                let r = &records[i];
                (r.view(), r.producer.as_deref().map(str::as_bytes).or(envelope))
            })
            .map_err(too_large)
    }

    fn markers_changed<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let mut out = Vec::new();
        let base = self.markers_base.as_ref().map(|b| b.bind(py));
        for (producer, marker) in self.markers.bind(py).iter() {
            let before = match base {
                Some(b) => b.get_item(&producer)?,
                None => None,
            };
            let same = match before {
                Some(b) => b.eq(&marker)?,
                None => false,
            };
            if !same {
                out.push(marker);
            }
        }
        Ok(out)
    }

    fn encoded_delta(&mut self, py: Python<'_>, first_offset: i64, last_offset: i64, last_input_ms: i64) -> PyResult<Option<Vec<u8>>> {
        if !self.core.journaling() {
            return Err(PyRuntimeError::new_err("take_delta() needs start_journal() first"));
        }
        let changed = self.markers_changed(py)?;
        let markers = if changed.is_empty() {
            None
        } else {
            let encode = py.import("msgspec.msgpack")?.getattr("encode")?;
            Some(encode.call1((PyList::new(py, changed)?,))?.extract::<Vec<u8>>()?)
        };
        let batch_id = self.batch_id.bind(py).to_str()?.to_owned();
        let run_id = match &self.run_id {
            Some(r) => Some(r.bind(py).to_str()?.to_owned()),
            None => None,
        };
        let header = DeltaHeader {
            batch_id: batch_id.as_bytes(),
            run_id: run_id.as_deref().map(str::as_bytes),
            first_offset,
            last_offset,
            last_input_ms,
        };
        let out = self.core.take_delta(&header, markers.as_deref());
        if out.is_some() {
            self.markers_base = Some(self.markers.bind(py).copy()?.unbind());
        }
        Ok(out.map(compress::compress_state))
    }

    fn expected(&self, py: Python<'_>) -> PyResult<u64> {
        let mut most = 0u64;
        for marker in self.markers.bind(py).values() {
            most = most.max(marker.getattr("expected_producers")?.extract::<u64>()?);
        }
        Ok(most)
    }

    fn apply_delta_inner(&mut self, py: Python<'_>, delta: &Bound<'_, PyAny>) -> PyResult<()> {
        let core = &mut self.core;
        let flat = delta.getattr("packed")?.cast_into::<PyList>().map_err(PyErr::from)?;
        let items: Vec<Bound<PyAny>> = flat.iter().collect();
        for chunk in items.chunks_exact(5) {
            let (s, g, sample) = (chunk[0].extract::<String>()?, chunk[1].extract::<String>()?, opt_str(&chunk[2])?);
            let counters = chunk[3].extract::<u64>()? as u128 | (chunk[4].extract::<u64>()? as u128) << 64;
            core.restore_packed(s.as_bytes(), g.as_bytes(), sample.as_deref().map(str::as_bytes), counters, None)
                .map_err(too_large)?;
        }
        let flat = delta.getattr("packed_versioned")?.cast_into::<PyList>().map_err(PyErr::from)?;
        let items: Vec<Bound<PyAny>> = flat.iter().collect();
        for chunk in items.chunks_exact(6) {
            let (s, g, sample) = (chunk[0].extract::<String>()?, chunk[1].extract::<String>()?, opt_str(&chunk[2])?);
            let counters = chunk[3].extract::<u64>()? as u128 | (chunk[4].extract::<u64>()? as u128) << 64;
            let version = opt_str(&chunk[5])?;
            core.restore_packed(
                s.as_bytes(),
                g.as_bytes(),
                sample.as_deref().map(str::as_bytes),
                counters,
                version.as_deref().map(str::as_bytes),
            )
            .map_err(too_large)?;
        }
        for entry in delta.getattr("entries")?.try_iter()? {
            let items: Vec<Bound<PyAny>> = entry?.try_iter()?.collect::<PyResult<_>>()?;
            if items.len() < 9 {
                return Err(PyValueError::new_err("a delta entry has fewer than 9 items"));
            }
            let (s, g) = (items[0].extract::<String>()?, items[1].extract::<String>()?);
            let conflict = items[2].is_truthy()?;
            if conflict {
                core.restore_entry(s.as_bytes(), g.as_bytes(), None).map_err(too_large)?;
                continue;
            }
            let state_hash = opt_str(&items[3])?;
            let mut counters = [None; 4];
            for (i, item) in items[4..8].iter().enumerate() {
                counters[i] = if item.is_none() { None } else { Some(item.extract::<u64>()?) };
            }
            let hist = if items[8].is_none() { None } else { Some(items[8].extract::<Vec<u64>>()?) };
            // entries written before weight versions existed have no tenth item, those
            // before tasks (and those of a value without one or a lag) no eleventh, those
            // before draft lags (and those of a value without one) no twelfth
            let version = match items.get(9) {
                Some(v) => opt_str(v)?,
                None => None,
            };
            let task = match items.get(10) {
                Some(t) => opt_str(t)?,
                None => None,
            };
            let draft_lag = match items.get(11) {
                Some(l) if !l.is_none() => Some(l.extract::<u64>()?),
                _ => None,
            };
            let value = Restored {
                state_hash: state_hash.as_deref().map(str::as_bytes),
                counters,
                hist,
                version: version.as_deref().map(str::as_bytes),
                task: task.as_deref().map(str::as_bytes),
                draft_lag,
            };
            core.restore_entry(s.as_bytes(), g.as_bytes(), Some(value)).map_err(too_large)?;
        }
        for occurrence in delta.getattr("occurrences")?.try_iter()? {
            let (s, sample, g): (String, Option<String>, String) = occurrence?.extract()?;
            core.restore_occurrence(s.as_bytes(), sample.as_deref().map(str::as_bytes), g.as_bytes())
                .map_err(too_large)?;
        }
        let counts = [
            delta.getattr("record_count")?.extract::<i64>()?,
            delta.getattr("invalid_record_count")?.extract::<i64>()?,
            delta.getattr("late_record_count")?.extract::<i64>()?,
            delta.getattr("conflicting_record_count")?.extract::<i64>()?,
        ];
        core.restore_counts(counts, delta.getattr("counters_seen")?.is_truthy()?);
        for (producer, n) in delta.getattr("received")?.cast_into::<PyDict>().map_err(PyErr::from)?.iter() {
            core.count_received(producer.extract::<String>()?.as_bytes(), n.extract::<i64>()?);
        }
        for marker in delta.getattr("markers")?.try_iter()? {
            self.add_marker(py, &marker?)?;
        }
        for name in delta.getattr("algorithms")?.try_iter()? {
            self.core.add_algorithm(name?.extract::<String>()?.as_bytes());
        }
        if self.core.journaling() {
            self.core.rebase_journal();
            self.markers_base = Some(self.markers.bind(py).copy()?.unbind());
        }
        Ok(())
    }
}

fn opt_str(obj: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if obj.is_none() {
        Ok(None)
    } else {
        Ok(Some(obj.extract::<String>()?))
    }
}

fn big_list<'py>(py: Python<'py>, values: &[u128]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, values.iter().copied())
}

fn opt_list<'py>(py: Python<'py>, values: &Option<Vec<u128>>) -> PyResult<Bound<'py, PyAny>> {
    Ok(match values {
        Some(v) => big_list(py, v)?.into_any(),
        None => py.None().into_bound(py),
    })
}

const SUM_FIELDS: [&str; 10] = [
    "accepted_total",
    "proposed_total",
    "verify_total",
    "completion_total",
    "paired_accepted_total",
    "paired_proposed_total",
    "accept_covered_count",
    "paired_completion_total",
    "paired_verify_total",
    "verify_covered_count",
];

/// A breakdown's entries as ``BreakdownSums`` (per weight version, per task, per draft
/// lag); `key` makes a key's Python object.
fn breakdown_list<'py, K>(
    schemas: &Bound<'py, PyModule>,
    entries: &[KeySums<K>],
    key: impl Fn(&K) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = schemas.py();
    let cls = schemas.getattr("BreakdownSums")?;
    let mut out = Vec::with_capacity(entries.len());
    for (name, sums, hist) in entries {
        let kw = PyDict::new(py);
        match name {
            Some(k) => kw.set_item("key", key(k)?)?,
            None => kw.set_item("key", py.None())?,
        }
        kw.set_item("unique_generation_count", sums[0])?;
        for (i, name) in SUM_FIELDS.iter().enumerate() {
            kw.set_item(*name, sums[i + 1])?;
        }
        kw.set_item("accept_histogram", opt_list(py, hist)?)?;
        out.push(cls.call((), Some(&kw))?);
    }
    Ok(out)
}

#[pymethods]
impl BatchState {
    #[new]
    #[pyo3(signature = (batch_id, run_id=None))]
    fn new(py: Python<'_>, batch_id: Bound<'_, PyString>, run_id: Option<Bound<'_, PyString>>) -> Self {
        BatchState {
            core: State::new(),
            batch_id: batch_id.unbind(),
            run_id: run_id.map(Bound::unbind),
            markers: PyDict::new(py).unbind(),
            markers_base: None,
            compacted_at: None,
        }
    }

    #[getter]
    fn record_count(&self) -> i64 {
        self.core.record_count
    }

    #[getter]
    fn invalid_record_count(&self) -> i64 {
        self.core.invalid_record_count
    }

    #[getter]
    fn late_record_count(&self) -> i64 {
        self.core.late_record_count
    }

    #[getter]
    fn conflicting_record_count(&self) -> i64 {
        self.core.conflicting_record_count
    }

    /// Distinct generations held (the size of the dedup state).
    #[getter]
    fn generation_count(&self) -> usize {
        self.core.generation_count()
    }

    /// The most producers any marker for this batch said to wait for (0: no marker).
    #[getter]
    fn expected_producers(&self, py: Python<'_>) -> PyResult<u64> {
        self.expected(py)
    }

    /// Markers from ``expected_producers`` distinct producers have arrived.
    #[getter]
    fn markers_complete(&self, py: Python<'_>) -> PyResult<bool> {
        let expected = self.expected(py)?;
        Ok(expected > 0 && self.markers.bind(py).len() as u64 >= expected)
    }

    /// A closed batch waiting out its grace: its arenas give back their spare capacity.
    /// (The native entry is already compact and holds no Python object, so there is
    /// nothing to pickle, unlike the Python core's ``compact``.) Late records still apply.
    fn compact(&mut self) {
        self.core.shrink();
        self.compacted_at = Some(self.seen());
    }

    /// ``compact`` ran and no record came since.
    #[getter]
    fn compacted(&self) -> bool {
        self.compacted_at == Some(self.seen())
    }

    /// Heap bytes of the dedup state (the memory benchmark reads it).
    fn heap_bytes(&self) -> usize {
        self.core.heap_bytes()
    }

    /// Apply one valid record; ``Outcome.AGGREGATED`` for a new occurrence.
    #[pyo3(signature = (record, *, late=false))]
    fn add<'py>(&mut self, py: Python<'py>, record: &Bound<'py, PyAny>, late: bool) -> PyResult<Bound<'py, PyAny>> {
        guard(|| {
            let owned = [OwnedRecord::read(record)?];
            let (aggregated, _, _) = self.apply_owned(&owned, late, None)?;
            let outcome = py.import("specmeter.streams.core.state")?.getattr("Outcome")?;
            outcome.getattr(if aggregated > 0 { "AGGREGATED" } else { "REDELIVERED" })
        })
    }

    /// Apply valid ``GenerationRecord`` objects; (aggregated, redelivered, conflicting).
    #[pyo3(signature = (records, *, late=false, producer_id=None))]
    fn add_many(&mut self, records: &Bound<'_, PyAny>, late: bool, producer_id: Option<String>) -> PyResult<(u64, u64, u64)> {
        guard(|| {
            let owned = records
                .try_iter()?
                .map(|r| OwnedRecord::read(&r?))
                .collect::<PyResult<Vec<_>>>()?;
            self.apply_owned(&owned, late, producer_id.as_deref())
        })
    }

    /// Apply records ``start:stop`` of a group of a decoded message (the hot path: no
    /// Python object per record when it was decoded natively).
    #[pyo3(signature = (decoded, group, start=0, stop=None, *, late=false, producer_id=None))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn add_decoded(
        &mut self,
        py: Python<'_>,
        decoded: &Bound<'_, PyAny>,
        group: usize,
        start: usize,
        stop: Option<usize>,
        late: bool,
        producer_id: Option<String>,
    ) -> PyResult<(u64, u64, u64)> {
        guard(|| {
            let Ok(native) = decoded.cast::<Decoded>() else {
                // decoded by Python (a message the native decoder handed over)
                let records = decoded.call_method1("records", (group, start, stop))?;
                return self.add_many(&records, late, producer_id);
            };
            let native = native.get();
            let (first, count) = native.slice(group, start, stop)?;
            let data = native.data.bind(py).as_bytes();
            let parsed = &native.parsed;
            let envelope = producer_id.as_deref().map(str::as_bytes);
            self.core
                .apply_many(count, late, |i| {
                    let r = &parsed.records[first + i];
                    let record = Record {
                        session: r.session.get(data),
                        generation: r.generation.get(data),
                        sample: r.sample.map(|s| s.get(data)),
                        state_hash: r.state_hash.map(|s| s.get(data)),
                        counters: r.counters.map(|c| c.map(u64::from)),
                        hist: r.hist.map(|(f, n)| parsed.bins.get(f as usize..(f + n) as usize).unwrap_or(&[])),
                        version: r.version.map(|s| s.get(data)),
                        task: r.task.map(|s| s.get(data)),
                        draft_lag: r.draft_lag.map(u64::from),
                    };
                    (record, r.producer.map(|s| s.get(data)).or(envelope))
                })
                .map_err(too_large)
        })
    }

    /// Count an invalid record attributed to this batch (every delivery counts).
    #[pyo3(signature = (producer_id=None, *, late=false))]
    fn add_invalid(&mut self, producer_id: Option<String>, late: bool) {
        self.core.add_invalid(producer_id.as_deref().map(str::as_bytes), late);
    }

    /// Record a producer's end-of-batch marker (a repeat replaces the earlier one).
    fn add_marker(&mut self, py: Python<'_>, marker: &Bound<'_, PyAny>) -> PyResult<()> {
        let producer = marker.getattr("producer_id")?;
        self.markers.bind(py).set_item(producer, marker)?;
        let algorithm = marker.getattr("speculative_algorithm")?;
        if algorithm.is_truthy()? {
            self.core.add_algorithm(algorithm.extract::<String>()?.as_bytes());
        }
        Ok(())
    }

    /// Name the batch's speculative algorithm without a marker (offline flag).
    fn add_algorithm(&mut self, name: &str) {
        self.core.add_algorithm(name.as_bytes());
    }

    /// Begin recording changes, to be taken as deltas by ``take_delta``.
    fn start_journal(&mut self, py: Python<'_>) -> PyResult<()> {
        self.core.start_journal();
        self.markers_base = Some(self.markers.bind(py).copy()?.unbind());
        Ok(())
    }

    /// What changed since the last delta, msgpack-encoded as ``BatchDelta`` and compressed
    /// (``core.layout.encode_delta``'s format); None if nothing did.
    #[pyo3(signature = (*, first_offset, last_offset, last_input_ms))]
    fn take_delta_encoded<'py>(
        &mut self,
        py: Python<'py>,
        first_offset: i64,
        last_offset: i64,
        last_input_ms: i64,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        guard(|| {
            let out = self.encoded_delta(py, first_offset, last_offset, last_input_ms)?;
            Ok(out.map(|b| PyBytes::new(py, &b)))
        })
    }

    /// What changed since the last delta as a ``BatchDelta``; None if nothing did.
    #[pyo3(signature = (*, first_offset, last_offset, last_input_ms))]
    fn take_delta<'py>(
        &mut self,
        py: Python<'py>,
        first_offset: i64,
        last_offset: i64,
        last_input_ms: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        guard(|| match self.encoded_delta(py, first_offset, last_offset, last_input_ms)? {
            Some(b) => py
                .import("specmeter.streams.core.layout")?
                .getattr("decode_delta")?
                .call1((PyBytes::new(py, &b),)),
            None => Ok(py.None().into_bound(py)),
        })
    }

    /// Replay one durable delta (restoring after a crash or a rebalance).
    fn apply_delta(&mut self, py: Python<'_>, delta: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| self.apply_delta_inner(py, delta))
    }

    /// This partition's sums for the batch (a ``PartialAggregate``).
    #[pyo3(signature = (*, partition=0, revision=0, close_reason="markers", closed_at_ms=0))]
    fn partial<'py>(
        &self,
        py: Python<'py>,
        partition: i64,
        revision: i64,
        close_reason: &str,
        closed_at_ms: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        guard(|| {
            let p = self.core.partial();
            let schemas = py.import("specmeter.schemas")?;
            let markers = self.markers.bind(py);
            let records_sent = PyDict::new(py);
            let mut producers = Vec::with_capacity(markers.len());
            for (producer, marker) in markers.iter() {
                records_sent.set_item(&producer, marker.getattr("records_sent")?)?;
                producers.push(producer);
            }
            let marker_producers = PyList::new(py, producers)?;
            marker_producers.sort()?;
            let received = PyDict::new(py);
            for (producer, n) in self.core.received() {
                received.set_item(text(producer), n)?;
            }
            let algorithms = self.core.algorithms_sorted().into_iter().map(text).collect::<Vec<_>>();
            let kw = PyDict::new(py);
            kw.set_item("batch_id", self.batch_id.bind(py))?;
            kw.set_item("run_id", self.run_id.as_ref().map(|r| r.bind(py)))?;
            kw.set_item("partition", partition)?;
            kw.set_item("revision", revision)?;
            kw.set_item("close_reason", close_reason)?;
            kw.set_item("closed_at_ms", closed_at_ms)?;
            kw.set_item("record_count", self.core.record_count)?;
            kw.set_item("invalid_record_count", self.core.invalid_record_count)?;
            kw.set_item("late_record_count", self.core.late_record_count)?;
            kw.set_item("records_received", received)?;
            kw.set_item("records_sent", records_sent)?;
            kw.set_item("marker_producers", marker_producers)?;
            kw.set_item("expected_producers", self.expected(py)?)?;
            kw.set_item("speculative_algorithms", algorithms)?;
            kw.set_item("counters_seen", self.core.counters_seen)?;
            kw.set_item("occurrence_count", p.occurrence_count)?;
            kw.set_item("unique_generation_count", p.unique_generation_count)?;
            kw.set_item("conflicting_generation_count", p.conflicting_generation_count)?;
            kw.set_item("sample_count", p.sample_count)?;
            for (i, name) in SUM_FIELDS.iter().enumerate() {
                kw.set_item(*name, p.totals[i + 1])?;
            }
            kw.set_item("accept_histogram", opt_list(py, &p.accept_histogram)?)?;
            kw.set_item("accept_ratio_samples", p.accept_ratio_samples)?;
            kw.set_item("accept_ratio_parts", p.accept_ratio_parts)?;
            kw.set_item("length_ratio_samples", p.length_ratio_samples)?;
            kw.set_item("length_ratio_parts", p.length_ratio_parts)?;
            let string = |k: &Vec<u8>| Ok(opt_text(py, Some(k.as_slice())));
            kw.set_item("weight_versions", breakdown_list(&schemas, &p.versions, string)?)?;
            kw.set_item("too_many_versions", p.too_many_versions)?;
            kw.set_item("inconsistent_generation_count", p.inconsistent_generation_count)?;
            kw.set_item("tasks", breakdown_list(&schemas, &p.tasks, string)?)?;
            kw.set_item("too_many_tasks", p.too_many_tasks)?;
            let number = |k: &u64| Ok(k.into_pyobject(py)?.into_any());
            kw.set_item("draft_lags", breakdown_list(&schemas, &p.draft_lags, number)?)?;
            kw.set_item("too_many_draft_lags", p.too_many_draft_lags)?;
            kw.set_item("tokens_per_verify_distribution", p.distribution)?;
            schemas.getattr("PartialAggregate")?.call((), Some(&kw))
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<native BatchState batch_id={} run_id={} generations={}>",
            self.batch_id.bind(py),
            self.run_id.as_ref().map_or("None".to_string(), |r| r.bind(py).to_string()),
            self.core.generation_count()
        )
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(decode, m)?)?;
    m.add_class::<Decoded>()?;
    m.add_class::<BatchState>()?;
    Ok(())
}
