"""Chunks of a prompt with images (issue 28): never text and image rows in one chunk, and an
image's rows whole, so the backend decodes each as embeddings in order (pure logic)."""

from __future__ import annotations

from inferflux.scheduler import Request, RequestId, Scheduler
from tests.unit.scheduler.test_scheduler import complete, summary

IMAGE = [-(i + 1) for i in range(6)]  # six embedding rows (pseudo tokens are negative)


def image_request(rid: str) -> Request:
    # 3 text tokens, an image of 6 rows, 4 text tokens
    prompt = [100, 101, 102, *IMAGE, 103, 104, 105, 106]
    return Request(
        request_id=RequestId(rid), prompt_token_ids=prompt, max_tokens=4, image_spans=((3, 9),)
    )


def test_a_chunk_stops_before_an_image_and_takes_it_whole_next() -> None:
    sched = Scheduler(max_num_seqs=2, max_batch_tokens=5, kv_capacity=None)
    request = image_request("a")
    sched.add(request)

    out = sched.schedule()
    assert summary(out) == [("a", 3, 0, 0, False)]  # the text before the image only
    complete(out)
    out = sched.schedule()
    # the whole image (6 rows) although the budget is 5
    assert summary(out) == [("a", 6, 3, 0, False)]
    assert out.chunks[0].token_ids == IMAGE
    complete(out)
    out = sched.schedule()
    assert summary(out) == [("a", 4, 9, 0, True)]


def test_a_chunk_that_starts_inside_an_image_takes_the_rest_of_it() -> None:
    """A prefix-cache hit may end inside an image (16-token blocks): the rest comes next."""
    sched = Scheduler(max_num_seqs=1, max_batch_tokens=64, kv_capacity=None)
    request = image_request("b")
    sched.add(request)
    out = sched.schedule()
    request.num_computed_tokens = 5  # as if the cache held 5 positions
    out = sched.schedule()
    assert summary(out) == [("b", 4, 5, 0, False)]
    assert out.chunks[0].token_ids == IMAGE[2:]


def test_text_only_prompts_are_chunked_as_before() -> None:
    sched = Scheduler(max_num_seqs=1, max_batch_tokens=4, kv_capacity=None)
    request = Request(RequestId("c"), list(range(100, 110)), max_tokens=2)
    sched.add(request)
    assert summary(sched.schedule()) == [("c", 4, 0, 0, False)]
