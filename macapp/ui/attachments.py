"""Pictures waiting to go with the next message: a strip of thumbnails in the composer, each with a remove button.

Files (the attach button, drag and drop) and pasted image data are read and checked off the GUI thread by the
core (macapp.core.vision.images: missing, not a picture, damaged, huge → scaled, animated → first frame), a pasted
picture encoded as PNG and each thumbnail scaled down there too; each good one becomes a thumbnail, each bad one a crossed-out tile in the strip whose reason the composer shows under it
(and an `error` naming it). The reason belongs to that tile: it goes when the tile is removed (×) or the message is
sent. `take()` hands the good pictures over with the message and empties the strip; `clear()` also forgets the
reads still in flight, so a picture read that ends after the send (its thread reports back later) can neither join
the next message unasked nor put an error about a message already sent back on screen.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QScrollArea, QToolButton, QWidget

from macapp.core.vision import images
from macapp.core.vision.capability import folder_support
from macapp.core.vision.images import ImageError, PreparedImage
from macapp.core.vision.mlx_frames import video_processor
from macapp.core.vision.video import PreparedVideo, VideoError, open_video

if TYPE_CHECKING:  # Pillow is imported on the first picture, not when the window paints
    from PIL import Image

THUMB = 64
VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".mkv", ".webm", ".avi")
IMAGE_FILTER = "Pictures and videos (*.png *.jpg *.jpeg *.gif *.webp *.bmp *.tif *.tiff " + " ".join(f"*{s}" for s in VIDEO_SUFFIXES) + ")"
STRIP_FRAMES = 8  # a video's tile shows at most this many of its sampled frames, evenly spread


def preview(image: Image.Image, size: int = THUMB) -> QImage:
    """A PIL image made small (twice `size`, for sharp scaling) as a QImage: the costly part of a thumbnail, safe
    on any thread (the picture's data is copied once, small)."""
    small = image.copy()
    small.thumbnail((size * 2, size * 2))
    rgb = small.convert("RGB")
    return QImage(rgb.tobytes(), rgb.width, rgb.height, rgb.width * 3, QImage.Format.Format_RGB888).copy()


def preview_item(picture: PreparedImage, size: int = THUMB) -> QImage:
    """A picture's preview; a video's: a strip of its sampled frames side by side, `size` high (any thread)."""
    if not isinstance(picture, PreparedVideo):
        return preview(picture.image, size)
    from PIL import Image

    frames = picture.pixels
    picks = sorted({round(i * (len(frames) - 1) / max(STRIP_FRAMES - 1, 1)) for i in range(min(STRIP_FRAMES, len(frames)))})
    height = size * 2
    width = max(1, round(frames.shape[3] * height / frames.shape[2]))
    strip = Image.new("RGB", (width * len(picks) + 2 * (len(picks) - 1), height), (20, 20, 20))
    for n, i in enumerate(picks):
        frame = Image.fromarray(frames[i].transpose(1, 2, 0)).resize((width, height))
        strip.paste(frame, (n * (width + 2), 0))
    return QImage(strip.tobytes(), strip.width, strip.height, strip.width * 3, QImage.Format.Format_RGB888).copy()


def video_caption(video: PreparedVideo) -> str:
    """What the strip says under a video: its length, the frames the model sees and their token cost."""
    plan = video.plan
    return f"{plan.info.duration_s:.1f} s · {plan.frames} frames · {plan.video_tokens:,} tokens"


_previews: dict[int, QImage] = {}  # id(picture) -> its preview, made where it was read; gone with the picture


def remember_preview(picture: PreparedImage, small: QImage) -> None:
    """Keep `small` as `picture`'s preview for as long as the picture lives (any thread)."""
    key = id(picture)
    _previews[key] = small
    weakref.finalize(picture, _previews.pop, key, None)


def preview_of(picture: PreparedImage, size: int = THUMB) -> QImage:
    """The picture's preview made when it was read (off the GUI thread), else one made now."""
    small = _previews.get(id(picture))
    return small if small is not None else preview_item(picture, size)


def pixmap_of(small: QImage, size: int = THUMB, width: int | None = None) -> QPixmap:
    """A preview as the pixmap shown, scaled to fit `size` (`width` x `size` for a video's strip; GUI thread:
    pixmaps live there)."""
    return QPixmap.fromImage(small).scaled(width or size, size, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)


def thumbnail(image: Image.Image, size: int = THUMB) -> QPixmap:
    """A Qt pixmap of a PIL image, scaled to fit `size` (preview() then pixmap_of(), here on one thread)."""
    return pixmap_of(preview(image, size), size)


def qimage_png(image: QImage) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")  # type: ignore[call-overload]  # the stub says bytes; PySide6 takes only str here (bytes raise)
    return bytes(data.data())


class Thumb(QWidget):
    removed = Signal(object)

    def __init__(self, picture: PreparedImage, parent: QWidget | None = None, small: QImage | None = None) -> None:
        super().__init__(parent)
        self.picture = picture
        self.order = 0  # when it was added (AttachmentStrip keeps that order)
        self.setObjectName("Attachment")
        width = VIDEO_WIDTH if isinstance(picture, PreparedVideo) else THUMB
        self.setFixedSize(QSize(width, THUMB))
        self.image = QLabel(self)
        self.image.setPixmap(
            pixmap_of(small if small is not None else preview_of(picture), THUMB - 18 * (width > THUMB), width)
        )  # `small`: made on the reading thread
        self.image.setFixedSize(QSize(width, THUMB))
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter | Qt.AlignmentFlag.AlignTop)
        tip = f"{Path(picture.name).name} — {picture.size[0]}×{picture.size[1]}"
        self.caption: QLabel | None = None
        if isinstance(picture, PreparedVideo):
            self.caption = QLabel(video_caption(picture), self)
            self.caption.setObjectName("VideoCaption")
            self.caption.setGeometry(0, THUMB - 18, width, 18)
            self.caption.setAlignment(Qt.AlignmentFlag.AlignCenter)
            tip = f"{Path(picture.name).name} — {picture.plan.frames} of {picture.plan.info.total_frames} frames at {picture.size[0]}×{picture.size[1]}"
        if picture.notes:
            tip += "\n" + "\n".join(picture.notes)
        self.setToolTip(tip)
        self.remove = QToolButton(self)
        self.remove.setText("×")
        self.remove.setToolTip(f"Remove {Path(picture.name).name}")
        self.remove.setAccessibleName(f"Remove {Path(picture.name).name}")
        self.remove.clicked.connect(lambda: self.removed.emit(self))
        # On the picture's top right corner: a row of its own above the picture left the strip half empty.
        self.remove.setFixedSize(QSize(20, 20))
        self.remove.move(width - 22, 2)
        self.remove.raise_()


VIDEO_WIDTH = THUMB * 5  # a video's tile: its strip of frames and its caption


class Unreadable(QWidget):
    """A file that could not be used as a picture: a tile in the strip (its name, × removes it and its reason)."""

    removed = Signal(object)

    def __init__(self, error: Exception, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = str(error)
        self.name = Path(getattr(error, "name", "") or "picture").name
        self.order = 0
        self.setObjectName("Unreadable")
        self.setFixedSize(QSize(THUMB, THUMB))
        self.label = QLabel(f"✕\n{self.name}", self)
        self.label.setObjectName("UnreadableName")
        self.label.setFixedSize(QSize(THUMB, THUMB))
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setWordWrap(True)
        self.setToolTip(self.message)
        self.remove = QToolButton(self)
        self.remove.setText("×")
        self.remove.setToolTip(f"Remove {self.name}")
        self.remove.setAccessibleName(f"Remove {self.name}")
        self.remove.clicked.connect(lambda: self.removed.emit(self))
        self.remove.setFixedSize(QSize(20, 20))
        self.remove.move(THUMB - 22, 2)
        self.remove.raise_()


class AttachmentStrip(QScrollArea):
    """The pending pictures; hidden while there are none."""

    changed = Signal()
    error = Signal(str)
    _ready = Signal(int, int, object, object)  # (batch, order added, a PreparedImage or an ImageError, its preview), from the reading thread
    progress = Signal(str, int, int)  # a video being decoded: (its name, frames decoded, frames to decode)
    _progress = Signal(int, str, int, int)  # the same from the reading thread, with its batch

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Attachments")
        self.setWidgetResizable(True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setFixedHeight(THUMB + 16)  # room for the scroll bar once the pictures overflow
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget(self)
        self.row = QHBoxLayout(inner)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(8)
        self.row.addStretch(1)
        self.setWidget(inner)
        self.viewport().setAutoFillBackground(False)  # the composer's own background, not a grey band across it
        inner.setAutoFillBackground(False)
        self.pending = 0  # pictures still being read
        self._added = 0  # pictures asked for so far: they are shown in that order, however fast each one reads
        self._batch = 0  # the message being composed; a read that reports for an earlier one (sent, cleared) is dropped
        self._ready.connect(self._arrived, Qt.ConnectionType.QueuedConnection)
        self._progress.connect(self._decoding, Qt.ConnectionType.QueuedConnection)
        self.video_model: Callable[[], Path | None] = lambda: None  # the loaded model's folder (its processor sizes a video's frames)
        self.setVisible(False)

    # -- adding (any thread reads; the GUI thread only places thumbnails)
    def add_files(self, paths: Iterable[str | Path]) -> None:
        for path in paths:
            if str(path).lower().endswith(VIDEO_SUFFIXES):
                self._read(self._video_reader(Path(path)), str(path))
                continue

            def read(p: str | Path = path) -> PreparedImage:
                return images.open_image(p)

            self._read(read, str(path))

    def _video_reader(self, path: Path) -> Callable[[], PreparedImage]:
        """Decode a video for the loaded model (its processor's frame size and sampling), reporting each frame."""
        folder, batch = self.video_model(), self._batch

        def read() -> PreparedImage:
            if folder is None:
                raise VideoError(str(path), "load a model that sees before attaching a video (its processor decides the frames)")
            if not folder_support(folder).sees:
                raise VideoError(str(path), "the loaded build is text-only: load a build marked 'images' to send a video")

            def report(done: int, total: int) -> None:
                try:
                    self._progress.emit(batch, path.name, done, total)
                except RuntimeError:  # the strip is gone (the window closed)
                    pass

            return open_video(path, video_processor(folder), progress=report)

        return read

    def _decoding(self, batch: int, name: str, done: int, total: int) -> None:
        if batch == self._batch:
            self.progress.emit(name, done, total)

    def add_image_data(self, data: bytes, name: str = "pasted picture") -> None:
        self._read(lambda: images.image_from_bytes(data, name), name)

    def add_qimage(self, image: QImage, name: str = "pasted picture") -> None:
        copy = image.copy()  # encoded as PNG on the reading thread, from a copy of its own
        self._read(lambda: images.image_from_bytes(qimage_png(copy), name), name)

    def _read(self, read: Callable[[], PreparedImage], name: str) -> None:
        self.pending += 1
        self._added += 1
        order, batch = self._added, self._batch

        def work() -> None:
            small: QImage | None = None
            result: PreparedImage | ImageError
            try:
                result = read()
                small = preview_item(result, THUMB * 2)  # big enough for the sent message's thumbnail too
                remember_preview(result, small)
            except ImageError as exc:
                result = exc
            except Exception as exc:  # noqa: BLE001 - a reader bug must not leave Send waiting forever
                result = ImageError(name, f"could not be read ({type(exc).__name__}: {exc})")
            try:
                self._ready.emit(batch, order, result, small)
            except RuntimeError:  # the strip is gone (the window closed)
                pass

        threading.Thread(target=work, name="read-picture", daemon=True).start()
        self.changed.emit()  # Send waits for this one

    def _arrived(self, batch: int, order: int, result: PreparedImage | ImageError, small: QImage | None = None) -> None:
        if batch != self._batch:
            return  # read for a message already sent or cleared: its pending count went with it
        self.pending -= 1
        tile: Unreadable | Thumb
        if isinstance(result, ImageError):
            tile = Unreadable(result, self.widget())
            self.error.emit(tile.message)
        else:
            tile = Thumb(result, self.widget(), small)
        tile.order = order
        tile.removed.connect(self._remove)
        self.row.insertWidget(sum(1 for t in self.tiles() if t.order < order), tile)
        self._refresh()

    def _remove(self, tile: QWidget) -> None:
        self.row.removeWidget(tile)
        tile.hide()
        tile.deleteLater()
        self._refresh()

    def _refresh(self) -> None:
        self.setVisible(bool(self.tiles()))
        self.changed.emit()

    # -- reading
    def tiles(self) -> list[Thumb | Unreadable]:
        """Every tile, good and unreadable, in the order they were added."""
        items = (item.widget() for i in range(self.row.count()) if (item := self.row.itemAt(i)) is not None)
        return [w for w in items if isinstance(w, (Thumb, Unreadable))]

    def thumbs(self) -> list[Thumb]:
        return [w for w in self.tiles() if isinstance(w, Thumb)]

    def unreadable(self) -> list[Unreadable]:
        return [w for w in self.tiles() if isinstance(w, Unreadable)]

    def errors(self) -> list[str]:
        """Why each unreadable file could not be used (what the composer shows under the strip)."""
        return [w.message for w in self.unreadable()]

    def pictures(self) -> tuple[PreparedImage, ...]:
        return tuple(t.picture for t in self.thumbs())

    def take(self) -> tuple[PreparedImage, ...]:
        """The pictures for the message being sent; the strip is empty after."""
        pictures = self.pictures()
        self.clear()
        return pictures

    def clear(self) -> None:
        """Empty the strip (the message was sent, or the pictures dropped): tiles, their errors and the reads
        still in flight, whose results are dropped when they arrive."""
        self._batch += 1
        self.pending = 0
        for tile in self.tiles():
            self.row.removeWidget(tile)
            tile.hide()
            tile.deleteLater()
        self._refresh()
