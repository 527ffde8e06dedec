"""What the app knows of the Hugging Face hub: its settings (endpoint, offline mode, cache folder), its HTTP API
(`api`: token, file listing, errors made actionable in `errors`), one typed record per model repo (config, files,
tensors by role) cached once on disk, and the MTP head fetched for builds that dropped it. The downloader
(macapp.core.download) sits on top of it; nothing here imports the downloader but the MTP head's fetch."""
