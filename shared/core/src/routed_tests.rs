use std::sync::Mutex;

use super::*;

/// A drafter that drafts its own mark `gamma` times and logs what its sessions received.
struct Marker {
    mark: u32,
    taps: Vec<usize>,
    gamma: usize,
    log: Arc<Mutex<Vec<String>>>,
}

struct MarkerSession {
    mark: u32,
    log: Arc<Mutex<Vec<String>>>,
}

impl Proposer for Marker {
    fn snapshot_spec(&self) -> SnapshotSpec {
        SnapshotSpec::taps(&self.taps, 1)
    }
    fn max_gamma(&self) -> usize {
        self.gamma
    }
    fn open(&self, _: &SamplingParams) -> Result<Box<dyn ProposerSession>, ProposeError> {
        self.log
            .lock()
            .expect("log")
            .push(format!("open {}", self.mark));
        Ok(Box::new(MarkerSession {
            mark: self.mark,
            log: self.log.clone(),
        }))
    }
}

impl ProposerSession for MarkerSession {
    fn extend(&mut self, rows: &SnapshotRows) -> Result<(), ProposeError> {
        let line = format!(
            "{} rows {}..{}",
            self.mark,
            rows.start,
            rows.start + rows.rows()
        );
        self.log.lock().expect("log").push(line);
        Ok(())
    }
    fn propose(&mut self, req: &ProposeRequest) -> Result<DraftBlock, ProposeError> {
        Ok(DraftBlock::point_masses(vec![self.mark; req.gamma], 0.5))
    }
}

/// Class "low" has ids below 10, "high" ids of 10 and above.
fn router() -> TokenRouter {
    TokenRouter {
        classes: vec!["low".into(), "high".into()],
        ids: (0..20).collect(),
        log_probs: vec![
            (0..20).map(|i| if i < 10 { -1.0 } else { -5.0 }).collect(),
            (0..20).map(|i| if i < 10 { -5.0 } else { -1.0 }).collect(),
        ],
        unseen: vec![-9.0, -9.0],
        bias: vec![0.0, 0.0],
        min_tokens: 1,
        max_tokens: None,
    }
}

fn routed(log: &Arc<Mutex<Vec<String>>>, default: usize) -> Routed {
    let route = |name: &str, mark, gamma| Route {
        name: name.into(),
        proposer: Arc::new(Marker {
            mark,
            taps: vec![3],
            gamma,
            log: log.clone(),
        }),
    };
    Routed::new(
        vec![route("low", 100, 8), route("high", 200, 6)],
        router(),
        default,
    )
    .expect("valid")
}

fn rows(start: usize, tokens: Vec<u32>, n: usize) -> SnapshotRows {
    SnapshotRows {
        start,
        width: 1,
        data: vec![0.0; n],
        tokens,
    }
}

struct Counts(Mutex<Vec<String>>);

impl RouteObserver for Counts {
    fn routed(&self, route: &str) {
        self.0.lock().expect("log").push(route.to_string());
    }
}

#[test]
fn the_first_rows_choose_the_drafter_for_the_whole_session() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let p = routed(&log, 0);
    assert_eq!(p.max_gamma(), 6, "the smallest of the routes' maxima");
    let counts = Arc::new(Counts(Mutex::new(Vec::new())));
    assert_eq!(p.observe_routes(counts.clone()), vec!["low", "high"]);
    let mut s = p.open(&SamplingParams::default()).expect("valid");
    assert!(
        log.lock().expect("log").is_empty(),
        "no drafter session before the rows"
    );
    s.extend(&rows(0, vec![12, 15, 3, 11], 4)).expect("valid");
    // Later rows of low ids do not move the session.
    s.extend(&rows(4, vec![1, 2], 2)).expect("valid");
    let block = s
        .propose(&ProposeRequest {
            anchor: 1,
            position: 6,
            gamma: 4,
        })
        .expect("valid");
    assert_eq!(block.tokens, vec![200; 4]);
    assert_eq!(
        *log.lock().expect("log"),
        vec!["open 200", "200 rows 0..4", "200 rows 4..6"]
    );
    assert_eq!(*counts.0.lock().expect("log"), vec!["high"]);
}

#[test]
fn rows_without_tokens_or_no_rows_take_the_default_route() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let p = routed(&log, 1);
    let mut s = p.open(&SamplingParams::default()).expect("valid");
    s.extend(&rows(0, Vec::new(), 3)).expect("valid");
    assert_eq!(log.lock().expect("log")[0], "open 200");
    let p = routed(&log, 0);
    let mut s = p.open(&SamplingParams::default()).expect("valid");
    let req = ProposeRequest {
        anchor: 15,
        position: 0,
        gamma: 2,
    };
    assert_eq!(s.propose(&req).expect("valid").tokens, vec![100, 100]);
}

#[test]
fn routes_must_match_the_router_and_share_their_rows() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let marker = |taps: Vec<usize>| -> Arc<dyn Proposer> {
        Arc::new(Marker {
            mark: 1,
            taps,
            gamma: 8,
            log: log.clone(),
        })
    };
    let named = |names: [&str; 2], second_taps: Vec<usize>| {
        vec![
            Route {
                name: names[0].into(),
                proposer: marker(vec![3]),
            },
            Route {
                name: names[1].into(),
                proposer: marker(second_taps),
            },
        ]
    };
    assert!(Routed::new(named(["high", "low"], vec![3]), router(), 0).is_err());
    assert!(Routed::new(named(["low", "high"], vec![4]), router(), 0).is_err());
    assert!(Routed::new(named(["low", "high"], vec![3]), router(), 2).is_err());
    let mut broken = router();
    broken.bias.pop();
    assert!(Routed::new(named(["low", "high"], vec![3]), broken, 0).is_err());
    assert!(Routed::new(named(["low", "high"], vec![3]), router(), 1).is_ok());
}
