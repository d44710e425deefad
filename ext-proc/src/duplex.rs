//! `FULL_DUPLEX_STREAMED` bodies: the replies kvroute owes Envoy beyond one per message.
//!
//! In that body mode (what Gateway API Inference Extension gateways use to call their
//! endpoint picker: Istio hard-codes it, Envoy AI Gateway defaults to it) Envoy streams the
//! body's chunks to kvroute without waiting for answers, and passes on only what kvroute sends
//! back: the server owns the body. kvroute therefore
//! - holds its reply to the request headers until the whole body is in (its last chunk says
//!   `end_of_stream`, or the request trailers end the request), so that it can route on the
//!   body; that reply carries the destination (header mutations and `envoy.lb` metadata);
//! - then echoes the body unchanged as [`StreamedBodyResponse`]s of at most [`MAX_CHUNK`]
//!   bytes, the last with `end_of_stream` (or, when trailers ended the request, none with it
//!   and the trailers' reply after them);
//! - echoes each response body chunk as it comes (same bytes, same `end_of_stream`).
//!
//! One Envoy message may thus need no reply (a request chunk before the last) or several (the
//! last one: the headers reply and the body's chunks). The [`Outbox`] queues them; the
//! service's driver sends them in order before it reads Envoy's next message.

use std::collections::VecDeque;

use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, BodyMutation, BodyResponse, CommonResponse, ProcessingResponse,
    StreamedBodyResponse,
};

/// The largest body chunk kvroute sends back in one message (64 KiB, as Gateway API Inference
/// Extension pickers do).
pub const MAX_CHUNK: usize = 64 * 1024;

/// Replies waiting to be sent, in order.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: VecDeque<Item>,
}

#[derive(Debug)]
enum Item {
    Reply(Box<ProcessingResponse>),
    Echo(Echo),
}

/// A body (or body chunk) to pass back, cut into [`MAX_CHUNK`] pieces as it is sent.
#[derive(Debug)]
struct Echo {
    request: bool,
    body: Vec<u8>,
    sent: usize,
    end_of_stream: bool,
}

impl Outbox {
    /// Queues one reply.
    pub fn push_reply(&mut self, reply: ProcessingResponse) {
        self.queue.push_back(Item::Reply(Box::new(reply)));
    }

    /// Queues `body` (of the request, or of the response) to be sent back unchanged, in
    /// pieces of at most [`MAX_CHUNK`] bytes, the last one with `end_of_stream`. An empty
    /// body is one empty piece when it ends the stream, nothing otherwise.
    pub fn push_echo(&mut self, request: bool, body: Vec<u8>, end_of_stream: bool) {
        if body.is_empty() && !end_of_stream {
            return;
        }
        self.queue.push_back(Item::Echo(Echo {
            request,
            body,
            sent: 0,
            end_of_stream,
        }));
    }

    /// The next reply to send, if any.
    pub fn pop(&mut self) -> Option<ProcessingResponse> {
        match self.queue.front_mut()? {
            Item::Reply(_) => match self.queue.pop_front() {
                Some(Item::Reply(r)) => Some(*r),
                _ => None,
            },
            Item::Echo(e) => {
                let end = e.body.len().min(e.sent + MAX_CHUNK);
                let last = end == e.body.len();
                let piece = if e.sent == 0 && last {
                    std::mem::take(&mut e.body)
                } else {
                    e.body[e.sent..end].to_vec()
                };
                e.sent = end;
                let reply = streamed_body(e.request, piece, last && e.end_of_stream);
                if last {
                    self.queue.pop_front();
                }
                Some(reply)
            }
        }
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// One piece of a body passed back in `FULL_DUPLEX_STREAMED` mode.
pub fn streamed_body(request: bool, body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let b = BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
    };
    crate::respond::body_reply(request, b)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;

    use super::*;
    use crate::respond;

    /// `(request?, bytes, end_of_stream)` of a streamed body reply.
    fn piece(r: &ProcessingResponse) -> (bool, Vec<u8>, bool) {
        let (request, b) = match &r.response {
            Some(Response::RequestBody(b)) => (true, b),
            Some(Response::ResponseBody(b)) => (false, b),
            other => panic!("not a body reply: {other:?}"),
        };
        let Some(Mutation::StreamedResponse(s)) = b
            .response
            .as_ref()
            .and_then(|c| c.body_mutation.as_ref())
            .and_then(|m| m.mutation.clone())
        else {
            panic!("not a streamed body: {r:?}")
        };
        (request, s.body, s.end_of_stream)
    }

    #[test]
    fn a_body_goes_back_whole_in_pieces_of_at_most_64_kib() {
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Outbox::default();
        out.push_echo(true, body.clone(), true);
        let mut pieces = Vec::new();
        while let Some(r) = out.pop() {
            pieces.push(piece(&r));
        }
        assert!(out.is_empty());
        assert_eq!(pieces.len(), 5, "300,000 bytes = 4 × 65,536 + 37,856");
        assert!(pieces
            .iter()
            .all(|(req, b, _)| *req && b.len() <= MAX_CHUNK));
        let ends: Vec<bool> = pieces.iter().map(|p| p.2).collect();
        assert_eq!(ends, [false, false, false, false, true]);
        let joined: Vec<u8> = pieces.into_iter().flat_map(|p| p.1).collect();
        assert_eq!(joined, body);
    }

    #[test]
    fn replies_and_echoes_keep_their_order_and_ends() {
        let mut out = Outbox::default();
        out.push_reply(respond::continue_request_headers());
        out.push_echo(true, b"abc".to_vec(), false);
        out.push_echo(true, Vec::new(), false);
        out.push_reply(respond::continue_trailers(true));
        out.push_echo(false, Vec::new(), true);
        assert!(matches!(
            out.pop().unwrap().response,
            Some(Response::RequestHeaders(_))
        ));
        assert_eq!(piece(&out.pop().unwrap()), (true, b"abc".to_vec(), false));
        assert!(
            matches!(
                out.pop().unwrap().response,
                Some(Response::RequestTrailers(_))
            ),
            "an empty chunk that does not end the body is not sent"
        );
        assert_eq!(piece(&out.pop().unwrap()), (false, Vec::new(), true));
        assert!(out.pop().is_none());
    }

    #[test]
    fn a_body_of_exactly_64_kib_is_one_piece() {
        let mut out = Outbox::default();
        out.push_echo(false, vec![7; MAX_CHUNK], true);
        let (_, b, end) = piece(&out.pop().unwrap());
        assert_eq!((b.len(), end), (MAX_CHUNK, true));
        assert!(out.pop().is_none());
    }
}
