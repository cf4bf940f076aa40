"""The live figure's PNG writer: Pillow reads back exactly the canvas' pixels."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from nbscale.ui.png import canvas_png


def test_the_png_holds_the_canvas_pixels() -> None:
    figure = Figure(figsize=(3.3, 2.1), dpi=100)
    axes = figure.add_subplot()
    axes.plot(np.arange(50), np.sin(np.arange(50) / 5), color="#d95319")
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    image = Image.open(io.BytesIO(canvas_png(canvas)))
    assert image.format == "PNG" and image.mode == "RGBA" and image.size == canvas.get_width_height()
    assert np.array_equal(np.asarray(image), np.asarray(canvas.buffer_rgba()))
