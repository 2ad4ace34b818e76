"""A request's progress: its step, its latest previews, and the partial images kept at
evenly spaced steps (at most `partial_images`, fewer when the run has fewer steps)."""

from __future__ import annotations

import numpy as np

from app.models.image_prompt import ImageProgress, ImagePrompt


def frame(value: int) -> list[np.ndarray]:
    return [np.full((2, 2, 3), value, dtype=np.uint8)]


def kept_steps(partial_images: int, steps: int) -> list[int]:
    progress = ImageProgress(partial_images=partial_images)
    for step in range(1, steps + 1):
        progress.advance(step, steps, frame(step))
    return [int(previews[0][0, 0, 0]) for previews in progress.partials()]


def test_partials_are_kept_at_evenly_spaced_steps():
    assert kept_steps(3, 20) == [5, 10, 15]
    assert kept_steps(2, 6) == [2, 4]
    assert kept_steps(1, 9) == [5]
    assert kept_steps(0, 9) == []


def test_a_run_of_fewer_steps_keeps_fewer_partials():
    assert kept_steps(3, 2) == [1, 2]
    assert kept_steps(3, 1) == [1]


def test_partials_are_read_from_where_the_reader_left_off_and_previews_are_the_latest():
    progress = ImageProgress(partial_images=2)
    assert progress.previews and progress.preview() == (0, [])
    for step in range(1, 7):
        progress.advance(step, 6, frame(step))
    assert len(progress.partials()) == 2 and len(progress.partials(1)) == 1
    step, latest = progress.preview()
    assert step == 6 and int(latest[0][0, 0, 0]) == 6
    progress.advance(7, 8)  # a step without previews keeps the last ones, and their step
    assert progress.preview()[0] == 6 and progress.read() == (7, 8)
    assert not ImageProgress().previews  # no previews unless asked


def test_a_rows_task_follows_its_init_image_and_mask():
    picture = np.zeros((8, 8, 3), np.uint8)
    assert ImagePrompt("a", seed=0).task == "text2image"
    assert ImagePrompt("a", seed=0, init_image=picture).task == "image2image"
    mask = np.zeros((8, 8), np.uint8)
    assert ImagePrompt("a", seed=0, init_image=picture, mask=mask).task == "inpainting"
