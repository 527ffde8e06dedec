"""Pictures waiting to go with the next message: a strip of thumbnails in the composer, each with a remove button.

Files (the attach button, drag and drop) and pasted image data are read and checked off the GUI thread by the
core (macapp.core.vision.images: missing, not a picture, damaged, huge → scaled, animated → first frame); each
good one becomes a thumbnail, each bad one an `error` naming it. `take()` hands the pictures over with the
message and empties the strip.
"""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QScrollArea, QToolButton, QWidget

THUMB = 64
IMAGE_FILTER = "Pictures (*.png *.jpg *.jpeg *.gif *.webp *.bmp *.tif *.tiff)"


def thumbnail(image, size: int = THUMB) -> QPixmap:
    """A Qt pixmap of a PIL image, scaled to fit `size` (the picture's data is copied once, small)."""
    small = image.copy()
    small.thumbnail((size * 2, size * 2))
    rgb = small.convert("RGB")
    qimage = QImage(rgb.tobytes(), rgb.width, rgb.height, rgb.width * 3, QImage.Format.Format_RGB888).copy()
    return QPixmap.fromImage(qimage).scaled(size, size, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)


def qimage_png(image: QImage) -> bytes:
    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(data.data())


class Thumb(QWidget):
    removed = Signal(object)

    def __init__(self, picture, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.picture = picture
        self.order = 0  # when it was added (AttachmentStrip keeps that order)
        self.setObjectName("Attachment")
        self.setFixedSize(QSize(THUMB, THUMB))
        self.image = QLabel(self)
        self.image.setPixmap(thumbnail(picture.image))
        self.image.setFixedSize(QSize(THUMB, THUMB))
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        tip = f"{Path(picture.name).name} — {picture.size[0]}×{picture.size[1]}"
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
        self.remove.move(THUMB - 22, 2)
        self.remove.raise_()


class AttachmentStrip(QScrollArea):
    """The pending pictures; hidden while there are none."""

    changed = Signal()
    error = Signal(str)
    _ready = Signal(int, object)  # (order added, a PreparedImage or an ImageError), from the reading thread

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
        self._ready.connect(self._arrived, Qt.ConnectionType.QueuedConnection)
        self.setVisible(False)

    # -- adding (any thread reads; the GUI thread only places thumbnails)
    def add_files(self, paths: list[str | Path]) -> None:
        from macapp.core.vision.images import open_image

        for path in paths:
            self._read(lambda p=path: open_image(p))

    def add_image_data(self, data: bytes, name: str = "pasted picture") -> None:
        from macapp.core.vision.images import image_from_bytes

        self._read(lambda: image_from_bytes(data, name))

    def add_qimage(self, image: QImage, name: str = "pasted picture") -> None:
        self.add_image_data(qimage_png(image), name)

    def _read(self, read) -> None:
        from macapp.core.vision.images import ImageError

        self.pending += 1
        self._added += 1
        order = self._added

        def work() -> None:
            try:
                self._ready.emit(order, read())
            except ImageError as exc:
                self._ready.emit(order, exc)

        threading.Thread(target=work, name="read-picture", daemon=True).start()

    def _arrived(self, order: int, result) -> None:
        from macapp.core.vision.images import ImageError

        self.pending -= 1
        if isinstance(result, ImageError):
            self.error.emit(str(result))
            self.changed.emit()
            return
        thumb = Thumb(result, self.widget())
        thumb.order = order
        thumb.removed.connect(self._remove)
        self.row.insertWidget(sum(1 for t in self.thumbs() if t.order < order), thumb)
        self.setVisible(True)
        self.changed.emit()

    def _remove(self, thumb: Thumb) -> None:
        self.row.removeWidget(thumb)
        thumb.hide()
        thumb.deleteLater()
        self._refresh()

    def _refresh(self) -> None:
        self.setVisible(bool(self.thumbs()))
        self.changed.emit()

    # -- reading
    def thumbs(self) -> list[Thumb]:
        items = (self.row.itemAt(i).widget() for i in range(self.row.count()))
        return [w for w in items if isinstance(w, Thumb)]

    def pictures(self) -> tuple:
        return tuple(t.picture for t in self.thumbs())

    def take(self) -> tuple:
        """The pictures for the message being sent; the strip is empty after."""
        pictures = self.pictures()
        self.clear()
        return pictures

    def clear(self) -> None:
        for thumb in self.thumbs():
            self.row.removeWidget(thumb)
            thumb.hide()
            thumb.deleteLater()
        self._refresh()
