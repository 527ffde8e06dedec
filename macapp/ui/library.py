"""The model library (first screen): every catalog build with size, fit badge, speed and download state."""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QSlider,
    QSpinBox,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from macapp.core import catalog, hardware
from macapp.core.fit import estimate
from macapp.core.hardware import MachineProfile
from macapp.core.hub.settings import hub_settings
from macapp.core.memory import format_bytes
from macapp.core.settings import Settings
from macapp.core.vision.builds import BuildVision, build_vision, refresh_catalog_and_pictures
from macapp.ui.details import DetailsPanel
from macapp.ui.downloads import DownloadController
from macapp.ui.library_model import FIT_COL, BadgeDelegate, LibraryModel, Row, short_context
from macapp.ui.settings import int_setting

# Past the native 262,144 tokens a model loads in long-context mode (YaRN ×2, ×4: macapp.core.long_context).
CONTEXT_STEPS = [2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1_010_000]
MAX_CONTEXT = 1_010_000  # the spin box's reach until the library knows its models' longest context (longest_context)
KV_CHOICES = [("Full precision", None), ("8-bit", 8), ("4-bit", 4)]


class LibraryPage(QWidget):
    """Emits `load_requested(ModelRef)` once the guardrail has passed (or the user chose Load anyway)."""

    load_requested = Signal(object)
    rows_changed = Signal()  # after every refresh: the Chat page's model picker follows
    machine_changed = Signal(object)
    hub_refreshed = Signal(object)  # {repo: error} for the builds the hub could not tell us about
    open_folder_requested = Signal()  # the window shows its folder dialog
    demo_requested = Signal()
    _machine_detected = Signal(object)
    _hub_answered = Signal(object)

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.machine: MachineProfile  # the profile the badges are computed for (a "what if" Mac when one is set); set below
        self.detected: MachineProfile  # this machine, always: "Load anyway" budgets with its real memory; set below
        self.entries: list[catalog.CatalogEntry] = []
        self.local_refs: list[catalog.ModelRef] = []
        self.downloads: DownloadController | None = None  # created in start()
        self._vision: dict[tuple[str | None, str, int], BuildVision] = {}  # (repo, folder, catalog size) -> whether the build sees pictures
        self._hub_answered.connect(self._hub_done)

        title = QLabel("Models", self)
        title.setObjectName("PageTitle")
        self.summary = QLabel(self)
        self.summary.setObjectName("Muted")
        self.summary.setWordWrap(True)

        self.context_slider = QSlider(Qt.Orientation.Horizontal, self)
        self.context_slider.setRange(0, len(CONTEXT_STEPS) - 1)
        self.context_slider.setPageStep(1)
        self.context_slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.context_slider.setMinimumWidth(120)
        self.context_spin = QSpinBox(self)
        self.context_spin.setRange(512, MAX_CONTEXT)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setGroupSeparatorShown(True)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.setKeyboardTracking(False)
        self.kv_combo = QComboBox(self)
        for text, bits in KV_CHOICES:
            self.kv_combo.addItem(text, bits)
        self.kv_combo.setToolTip("Quantize the attention KV cache to fit longer contexts (small quality cost)")
        self.open_folder_button = QPushButton("Open Folder…", self)
        self.open_folder_button.setToolTip("Load an MLX Qwen3.5 model from a folder on this Mac")
        self.remove_folder_button = QPushButton("Remove from Library", self)
        self.remove_folder_button.setToolTip("Forget this folder here (its files stay where they are)")
        self.remove_folder_button.hide()
        self.demo_button = QPushButton("Try the Demo Model", self)
        self.demo_button.setToolTip(
            "A tiny model made on this Mac in a second, no download: it gives the same reply to anything, it only shows the app working"
        )

        controls = QHBoxLayout()
        controls.setSpacing(8)
        controls.addWidget(QLabel("Context", self))
        controls.addWidget(self.context_slider, 1)
        controls.addWidget(self.context_spin)
        controls.addSpacing(16)
        controls.addWidget(QLabel("KV cache", self))
        controls.addWidget(self.kv_combo)
        controls.addStretch(0)
        controls.addSpacing(16)
        controls.addWidget(self.demo_button)
        controls.addWidget(self.open_folder_button)

        self.model = LibraryModel(self)
        self.table = QTableView(self)
        self.table.setModel(self.model)
        self.table.setItemDelegateForColumn(FIT_COL, BadgeDelegate(self.table))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setShowGrid(False)
        self.table.setAlternatingRowColors(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(34)
        self.table.setWordWrap(False)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        header = self.table.horizontalHeader()
        header.setHighlightSections(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)  # the names give way first: a status stays whole
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.table.doubleClicked.connect(lambda _i: self.request_load())

        self.details = DetailsPanel(self)
        self.details.load_clicked.connect(self.request_load)
        self.details.buttons.insertWidget(1, self.remove_folder_button)  # beside Load: both act on the selected row
        split = QSplitter(self)
        split.addWidget(self.table)
        split.addWidget(self.details)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        split.setSizes([660, 280])  # the table's six columns whole; the details wrap
        self.splitter = split

        lay = QVBoxLayout(self)
        lay.setContentsMargins(20, 16, 20, 12)
        lay.setSpacing(10)
        lay.addWidget(title)
        lay.addWidget(self.summary)
        lay.addLayout(controls)
        lay.addWidget(split, 1)

        # Restore choices before wiring, so restoring does not write them back.
        self.context_spin.setValue(int_setting(settings, "library.context", 32768))
        self.context_slider.setValue(self._step_for(self.context_spin.value()))
        kv = settings.get("library.kv_bits")
        self.kv_combo.setCurrentIndex(max(0, self.kv_combo.findData(kv)) if kv is not None else 0)
        self.context_slider.valueChanged.connect(lambda i: self.context_spin.setValue(CONTEXT_STEPS[i]))
        self.context_spin.valueChanged.connect(self._context_changed)
        self.kv_combo.currentIndexChanged.connect(lambda _i: self._choices_changed())
        self.table.selectionModel().currentRowChanged.connect(lambda cur, _prev: self._show_details(cur.row()))
        self.open_folder_button.clicked.connect(self.open_folder_requested)
        self.remove_folder_button.clicked.connect(self.remove_selected_folder)
        self.demo_button.clicked.connect(self.demo_requested)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._row_menu)

        self.entries = catalog.load_catalog()
        self.local_refs = self._remembered_folders()
        # A quick profile for the first paint (no MLX import); start() replaces it with the full one.
        self.detected = hardware.detect_machine(use_mlx=False)
        self.machine = self._what_if() or self.detected
        self._machine_detected.connect(self._on_detected)
        self.refresh()

    def _what_if(self) -> MachineProfile | None:
        """A 'what if' Mac chosen in settings (`machine.what_if`: {"chip": "M4 Pro", "memory_gb": 48})."""
        spec = self.settings.get("machine.what_if")
        if not isinstance(spec, dict) or not spec.get("chip"):
            return None
        chip, memory_gb, gpu_cores = spec["chip"], spec.get("memory_gb", 16), spec.get("gpu_cores")
        if not isinstance(chip, str) or not isinstance(memory_gb, (int, float, str)) or not (gpu_cores is None or isinstance(gpu_cores, int)):
            return None  # not a chip name, a size and a core count (a hand-edited settings file)
        try:
            return hardware.what_if_machine(chip, int(float(memory_gb) * 1024**3), gpu_cores)
        except (hardware.HardwareError, ValueError, TypeError):
            return None

    def _on_detected(self, machine: MachineProfile) -> None:
        self.detected = machine
        if self._what_if() is None:
            self.set_machine(machine)

    def set_machine(self, machine: MachineProfile) -> None:
        self.machine = machine
        self.refresh()
        self.machine_changed.emit(machine)

    # -- choices ------------------------------------------------------------------------------------------------
    @property
    def context(self) -> int:
        return self.context_spin.value()

    @property
    def kv_bits(self) -> int | None:
        bits = self.kv_combo.currentData()
        return bits if isinstance(bits, int) else None  # KV_CHOICES: None, 8 or 4

    @staticmethod
    def _step_for(value: int) -> int:
        return min(range(len(CONTEXT_STEPS)), key=lambda i: abs(CONTEXT_STEPS[i] - value))

    def _context_changed(self, value: int) -> None:
        self.context_slider.blockSignals(True)
        self.context_slider.setValue(self._step_for(value))
        self.context_slider.blockSignals(False)
        self._choices_changed()

    def longest_context(self) -> int:
        """The most tokens any model in the library takes (its YaRN limit where YaRN applies): the spin box's reach."""
        return max((ref.arch.max_position_embeddings for ref in self._refs()), default=MAX_CONTEXT)

    def _set_reach(self) -> None:
        longest = self.longest_context()
        if self.context_spin.maximum() != longest:
            self.context_spin.blockSignals(True)  # a clamp here is written back by the refresh that follows
            self.context_spin.setMaximum(longest)
            self.context_spin.blockSignals(False)

    def _choices_changed(self) -> None:
        self.settings.update({"library.context": self.context, "library.kv_bits": self.kv_bits})
        self.refresh()

    def set_context(self, tokens: int) -> None:
        self.context_spin.setValue(tokens)

    # -- data ---------------------------------------------------------------------------------------------------
    def _sees(self, ref: catalog.ModelRef) -> BuildVision:
        """Whether a build accepts pictures (macapp.core.vision.builds), read once per build and catalog load."""
        key = (ref.repo, str(ref.local_path), len(self.entries))
        if key not in self._vision:
            self._vision[key] = build_vision(ref)
        return self._vision[key]

    def _refs(self) -> list[catalog.ModelRef]:
        refs = []
        for entry in self.entries:
            for bits in sorted(entry.builds):
                refs.append(catalog.model_ref(entry, entry.build(bits)))  # no catalog.json re-read per build
        return refs + self.local_refs

    def refresh(self) -> None:
        """Recompute every row at the chosen context and KV bits (pure arithmetic: instant)."""
        selected = self.selected_row()
        keep = selected.key if selected else self.settings.get("library.selected")
        self._set_reach()
        rows = []
        for ref in self._refs():
            # A model with a shorter maximum context is sized at its maximum; pictures are reported, not counted.
            seen = self._sees(ref)
            est = estimate.estimate(
                ref,
                min(self.context, ref.arch.max_position_embeddings),
                self.machine,
                kv_bits=self.kv_bits,
                vision=seen.cost,
                accepts_images=seen.accepts_images,
            )
            path = ref.local_path or (self.downloads.local_path(ref) if self.downloads else None)
            rows.append(Row(ref=ref, estimate=est, downloaded=path is not None, local_path=path))
        self.model.set_rows(rows, self.context, self.machine)
        self.rows_changed.emit()
        suggestion = self.suggested_row()
        self._update_summary(suggestion)
        target = next((i for i, r in enumerate(rows) if r.key == keep), None)
        if target is None and suggestion is not None:
            target = rows.index(suggestion)
        if target is not None:
            self.table.selectRow(target)
        self._show_details(self.table.currentIndex().row())

    def suggested_row(self) -> Row | None:
        """The best model that fits: the largest build (most weights) whose verdict is 'fits'."""
        fitting = [r for r in self.model.rows if r.estimate.verdict == "fits" and r.ref.origin is catalog.Origin.CATALOG]
        return max(fitting, key=lambda r: (r.estimate.weights_bytes, -(r.ref.bits or 16)), default=None)

    def _update_summary(self, suggestion: Row | None) -> None:
        parts = []
        if suggestion is not None:
            parts.append(f"Best fit for this Mac at {short_context(self.context)} context: <b>{suggestion.title} {suggestion.ref.bits}-bit</b>")
        else:
            parts.append(f"No model fits this Mac at {short_context(self.context)} context: try a shorter context or a 4-bit KV cache")
        if catalog.hub_offline():
            parts.append("You are offline (HF_HUB_OFFLINE): sizes and badges come from built-in data; downloads are unavailable")
        elif self.downloads is not None and self.downloads.hub_unreachable:
            host = hub_settings().host_label
            parts.append(f"{host} cannot be reached: downloads are unavailable until it can; sizes and badges come from built-in data")
        self.summary.setText(" · ".join(parts))

    def selected_row(self) -> Row | None:
        idx = self.table.currentIndex()
        return self.model.rows[idx.row()] if idx.isValid() and idx.row() < len(self.model.rows) else None

    def select(self, key_or_name: str) -> Row:
        for i, row in enumerate(self.model.rows):
            if key_or_name in (row.key, row.title, f"{row.title}-{row.ref.bits}bit"):
                self.table.selectRow(i)
                return row
        raise KeyError(key_or_name)

    def _show_details(self, index: int) -> None:
        row = self.model.rows[index] if 0 <= index < len(self.model.rows) else None
        if row is not None:
            self.settings.set("library.selected", row.key)
        if row is not None:
            self.model.advice_for(row)
        self.remove_folder_button.setVisible(row is not None and row.ref.origin is catalog.Origin.LOCAL)
        self.details.show_row(row, self.machine, self.context, self.kv_bits)
        if self.downloads is not None:
            self.downloads.show_for(row)

    # -- actions ------------------------------------------------------------------------------------------------
    def start(self, wait: bool = False) -> MachineProfile:
        """After the first paint: the full hardware probe (MLX's Metal budget, off the GUI thread) and downloads."""
        # Always probe this machine: with a "what if" profile the badges use it, but "Load anyway" needs the real RAM.
        probe = threading.Thread(target=lambda: self._machine_detected.emit(hardware.detect_machine()), daemon=True)
        probe.start()
        if wait:
            probe.join()
        if self.downloads is None:
            self.downloads = DownloadController(self.details.download_panel, self)
            self.downloads.finished.connect(lambda _key: self.refresh())
            self.downloads.status_changed.connect(self.model.set_live_status)
            self.downloads.hub_checked.connect(lambda _reachable: self._update_summary(self.suggested_row()))
            self.refresh()
            self.downloads.check_hub()  # said up front when the hub cannot be reached, not when Download is pressed
        return self.machine

    def refresh_from_hub(self, wait: bool = False) -> None:
        """Read every build's real config.json and exact file sizes from the hub (off the GUI thread), then redo the rows."""
        worker = threading.Thread(target=lambda: self._hub_answered.emit(refresh_catalog_and_pictures()), daemon=True)
        worker.start()
        if wait:
            worker.join()

    def _hub_done(self, errors: dict[str, str]) -> None:
        self.entries = catalog.load_catalog()
        self._vision.clear()  # what the hub's files said about pictures is read again
        self.refresh()
        self.hub_refreshed.emit(errors)

    def open_local_folder(self, folder: str) -> Row | None:
        """Add a model folder to the library (remembered across restarts) and select it."""
        try:
            ref = catalog.model_from_folder(Path(folder).resolve())
        except (catalog.UnknownModel, catalog.ConfigError) as exc:
            QMessageBox.warning(self, "Not a Qwen3.5 model folder", str(exc))
            return None
        self.local_refs = [r for r in self.local_refs if r.local_path != ref.local_path] + [ref]
        self._remember_folders()
        self.refresh()
        return self.select(str(ref.local_path))

    def remove_local_folder(self, folder: str | Path) -> bool:
        """Forget a folder opened earlier (its files are left alone); False if it was not in the library."""
        path = Path(folder)
        kept = [r for r in self.local_refs if r.local_path is None or Path(r.local_path) != path]  # a folder's ref has its path
        if len(kept) == len(self.local_refs):
            return False
        self.local_refs = kept
        self._remember_folders()
        self.refresh()
        return True

    def remove_selected_folder(self) -> None:
        row = self.selected_row()
        if row is not None and row.ref.origin is catalog.Origin.LOCAL and row.ref.local_path is not None:  # a folder's row has its path
            self.remove_local_folder(row.ref.local_path)

    def _row_menu(self, pos: QPoint) -> None:
        from PySide6.QtWidgets import QMenu

        index = self.table.indexAt(pos)
        if not index.isValid():
            return
        self.table.selectRow(index.row())
        row = self.model.rows[index.row()]
        menu = QMenu(self)
        if row.local_path is not None:
            menu.addAction("Load", self.request_load)
        if row.ref.origin is catalog.Origin.LOCAL:
            menu.addAction("Remove from Library", self.remove_selected_folder)
        if not menu.isEmpty():
            menu.exec(self.table.viewport().mapToGlobal(pos))

    def _remember_folders(self) -> None:
        self.settings.set("library.folders", [str(r.local_path) for r in self.local_refs])

    def _remembered_folders(self) -> list[catalog.ModelRef]:
        """The folders opened in earlier sessions that still hold a model (a moved or deleted one is left out)."""
        refs = []
        folders = self.settings.get("library.folders")
        for folder in folders if isinstance(folders, list) else []:
            if not isinstance(folder, str):
                continue  # Path() of it would raise the TypeError caught below
            try:
                refs.append(catalog.model_from_folder(Path(folder)))
            except (catalog.UnknownModel, catalog.ConfigError, OSError, TypeError):
                continue
        return refs

    def set_loaded(self, path: str | Path | None) -> None:
        """Mark the row of the model the chat has loaded (None: none is)."""
        self.model.set_loaded(Path(path) if path is not None else None)

    def rows_on_disk(self) -> list[Row]:
        """The rows that can be loaded now: downloaded builds and folders."""
        return [r for r in self.model.rows if r.local_path is not None]

    def load_row(self, key: str) -> bool:
        """Select the row `key` and load it (through the same guardrail as the Load button)."""
        try:
            self.select(key)
        except KeyError:
            return False
        return self.request_load()

    def guardrail_message(self, row: Row) -> str | None:
        """Why loading this row is refused (None when it fits or is tight)."""
        est = row.estimate
        if est.verdict != "too_big":
            return None
        lines = [
            f"{row.title} needs about {format_bytes(est.total_bytes)} at {self.context:,} tokens of context, "
            f"but this Mac's GPU budget is {format_bytes(est.budget_bytes)}.",
        ]
        ways_out = self.model.advice_for(row).lines()[1:]  # the headline repeats the first line
        if ways_out:
            lines.append("Ways to make it fit:\n" + "\n".join(ways_out))
        lines.append("Loading it anyway may make macOS swap heavily or stop the app.")
        return "\n\n".join(lines)

    def request_load(self, force: bool = False) -> bool:
        """Load the selected model: refused with the reason when it does not fit, unless the user says Load anyway."""
        row = self.selected_row()
        if row is None:
            return False
        path = row.local_path
        if path is None:
            QMessageBox.information(self, "Download first", f"{row.title} {row.ref.bits}-bit is not on this Mac yet: download it first.")
            return False
        reason = self.guardrail_message(row)
        if reason and not force:
            box = QMessageBox(QMessageBox.Icon.Warning, "This model does not fit", reason, parent=self)
            box.setObjectName("GuardrailDialog")
            anyway = box.addButton("Load anyway", QMessageBox.ButtonRole.DestructiveRole)
            box.addButton(QMessageBox.StandardButton.Cancel)
            box.setDefaultButton(QMessageBox.StandardButton.Cancel)
            self.last_guardrail = box
            box.exec()
            if box.clickedButton() is not anyway:
                return False
        from dataclasses import replace

        load = row.ref.load
        if reason:
            # The user took the risk: the engine's per-message memory check then uses all of the RAM, not the GPU budget.
            # This machine's RAM, never a "what if" profile's.
            load = catalog.LoadChoice(anyway=True, memory_budget_bytes=int((self.detected or self.machine).memory_bytes))
        self.load_requested.emit(replace(row.ref, local_path=Path(path), load=load))
        return True

    def shutdown(self) -> None:
        if self.downloads is not None:
            self.downloads.shutdown()
