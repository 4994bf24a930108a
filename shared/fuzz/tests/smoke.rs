//! The brief fuzz run of CI: every target on its seeds and a few thousand deterministic
//! mutations of them ([`tandem_fuzz::mutate`]), each input under `catch_unwind` and a
//! global allocator that records the largest single allocation, so a panic or an
//! allocation above [`CAP`] fails the test and names the input (saved to the temp dir).
//! Long, coverage-guided runs are cargo-fuzz's (docs/fuzzing.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use tandem_fuzz::mutate::Mutator;
use tandem_fuzz::{Target, TARGETS};

/// The largest single allocation an input may cause.
const CAP: usize = 256 << 20;
/// Mutated inputs per target, and the time a target may take for them.
const MUTATIONS: usize = 4000;
const BUDGET: Duration = Duration::from_secs(5);

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// The system allocator, noting each thread's largest allocation.
struct Noting;

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is passed to the system allocator unchanged; noting a size touches
// only a const-initialised thread-local cell, which never allocates.
unsafe impl GlobalAlloc for Noting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Noting = Noting;

/// How a target failed on one input.
#[derive(Debug)]
enum Failure {
    Panic(String),
    Allocation(usize),
}

/// Runs `run` on `input`: a panic, or an allocation above [`CAP`] on this thread, fails.
fn check(run: fn(&[u8]), input: &[u8]) -> Result<(), Failure> {
    LARGEST.with(|l| l.set(0));
    let outcome = catch_unwind(AssertUnwindSafe(|| run(input)));
    let largest = LARGEST.with(Cell::get);
    if let Err(p) = outcome {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        return Err(Failure::Panic(msg.unwrap_or_default()));
    }
    match largest > CAP {
        true => Err(Failure::Allocation(largest)),
        false => Ok(()),
    }
}

/// Seeds, then mutations of seeds (spliced with the next seed) until [`MUTATIONS`] or
/// [`BUDGET`]; returns how many inputs ran.
fn fuzz(target: &Target) -> usize {
    // Loads what the target keeps (the engine, the real dims) outside the measurement.
    (target.run)(&[]);
    let seeds = (target.seeds)();
    assert!(!seeds.is_empty(), "{} has no seeds", target.name);
    let mut mutator = Mutator::new(target.name.len() as u64);
    let started = Instant::now();
    let mut ran = 0;
    for i in 0..seeds.len() + MUTATIONS {
        if started.elapsed() > BUDGET {
            break;
        }
        let input = match i < seeds.len() {
            true => seeds[i].clone(),
            false => mutator.mutate(&seeds[i % seeds.len()], &seeds[(i + 1) % seeds.len()]),
        };
        if let Err(f) = check(target.run, &input) {
            let saved = std::env::temp_dir().join(format!("tandem-fuzz-{}-{i}.bin", target.name));
            let _ = std::fs::write(&saved, &input);
            panic!(
                "{} failed on input {i} ({}): {f:?}",
                target.name,
                saved.display()
            );
        }
        ran += 1;
    }
    ran
}

fn target(name: &str) -> &'static Target {
    TARGETS
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no target {name}"))
}

macro_rules! fuzz_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let ran = fuzz(target(stringify!($name)));
                eprintln!("{}: {ran} inputs", stringify!($name));
                assert!(ran > 50, "only {ran} inputs ran");
            }
        )*

        #[test]
        fn every_target_has_a_test() {
            let tested = [$(stringify!($name)),*];
            for t in TARGETS {
                assert!(tested.contains(&t.name), "{} is not run", t.name);
            }
        }
    };
}

fuzz_tests!(
    generate_request,
    draft_request,
    draft_response,
    gguf_header,
    hf_config,
    dspark_manifest,
    calibration,
    safetensors_index,
    safetensors,
    router_manifest,
);

#[test]
fn an_allocation_above_the_cap_fails() {
    fn greedy(_: &[u8]) {
        let v: Vec<u8> = Vec::with_capacity(CAP + 1);
        std::hint::black_box(v);
    }
    assert!(matches!(check(greedy, b""), Err(Failure::Allocation(n)) if n > CAP));
    assert!(check(|_| drop(std::hint::black_box(vec![0u8; 1 << 20])), b"").is_ok());
}

#[test]
fn a_panicking_target_fails() {
    fn fragile(data: &[u8]) {
        assert!(data.len() < 3, "too long");
    }
    assert!(check(fragile, b"ab").is_ok());
    assert!(matches!(check(fragile, b"abc"), Err(Failure::Panic(m)) if m.contains("too long")));
}

/// Writes every target's seeds into cargo-fuzz's corpus folders (`fuzz/corpus/<target>/`),
/// for long runs by hand (docs/fuzzing.md).
#[test]
#[ignore = "writes the cargo-fuzz corpus; run by hand"]
fn write_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for t in TARGETS {
        let dir = root.join(t.name);
        std::fs::create_dir_all(&dir).expect("corpus folder");
        for (i, seed) in (t.seeds)().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed).expect("seed written");
        }
    }
}
