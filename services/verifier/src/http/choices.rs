//! The `n` generations of one HTTP request, each started through the generation core
//! (admitted like any request), their chunks merged into one channel tagged with the
//! choice's index. The first choice is started before the answer begins, so a refusal
//! (invalid, queue full, draining) is the HTTP status; a later choice refused mid-answer
//! ends a stream with an error event. Dropping [`Choices`] (the client went away) drops
//! every generation's stream, which ends them.

use std::sync::Arc;
use std::time::Instant;

use tandem_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::Status;

use crate::client_stream::Item;
use crate::generations::Generations;

/// Chunks buffered per choice between the generations and the answer.
const BUFFER_PER_CHOICE: usize = 16;

/// A chunk (or the status that ended it) of choice `.0`.
pub(crate) type Event = (u32, Item);

/// The running choices of one request.
pub(crate) struct Choices {
    rx: mpsc::Receiver<Event>,
    n: usize,
    _tasks: JoinSet<()>,
}

/// A finished choice, gathered.
#[derive(Debug, Default)]
pub(crate) struct Gathered {
    /// The whole text.
    pub(crate) text: String,
    /// Every token.
    pub(crate) token_ids: Vec<u32>,
    /// Their log-probabilities, when asked for.
    pub(crate) logprobs: Vec<pb::TokenLogprob>,
    /// How it finished.
    pub(crate) finished: pb::Finished,
}

/// Starts one generation per request (at least one), all answering by `deadline`.
pub(crate) async fn start(
    core: &Arc<Generations>,
    requests: Vec<pb::GenerateRequest>,
    deadline: Option<Instant>,
) -> Result<Choices, Status> {
    let n = requests.len();
    let (tx, rx) = mpsc::channel(BUFFER_PER_CHOICE * n.max(1));
    let mut tasks = JoinSet::new();
    for (i, r) in (0u32..).zip(requests) {
        let tx = tx.clone();
        if i == 0 {
            let first = core.start(r, deadline).await?;
            tasks.spawn(forward(i, first, tx));
        } else {
            let core = Arc::clone(core);
            tasks.spawn(async move {
                match core.start(r, deadline).await {
                    Ok(rx) => forward(i, rx, tx).await,
                    Err(status) => drop(tx.send((i, Err(status))).await),
                }
            });
        }
    }
    Ok(Choices {
        rx,
        n,
        _tasks: tasks,
    })
}

/// Forwards choice `i`'s chunks until it ends or the answer is dropped.
async fn forward(i: u32, mut rx: mpsc::Receiver<Item>, tx: mpsc::Sender<Event>) {
    while let Some(item) = rx.recv().await {
        if tx.send((i, item)).await.is_err() {
            return;
        }
    }
}

impl Choices {
    /// How many choices there are.
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// The next chunk of any choice; `None` once every choice's stream closed.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Every choice gathered, in index order; the first status that ended one otherwise.
    pub(crate) async fn gather(mut self) -> Result<Vec<Gathered>, Status> {
        let mut all: Vec<Gathered> = (0..self.n).map(|_| Gathered::default()).collect();
        let mut done = 0;
        while let Some((i, item)) = self.next().await {
            let msg = item?;
            let Some(g) = all.get_mut(i as usize) else {
                continue;
            };
            g.text.push_str(&msg.text);
            g.token_ids.extend(msg.token_ids);
            g.logprobs.extend(msg.logprobs);
            if let Some(f) = msg.finished {
                g.finished = f;
                done += 1;
                if done == self.n {
                    return Ok(all);
                }
            }
        }
        Err(Status::unavailable("a generation ended without a finish"))
    }
}
