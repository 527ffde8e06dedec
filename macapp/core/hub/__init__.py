"""What the app knows of the Hugging Face hub: its settings (endpoint, offline mode), one typed record per model
repo (config, files, tensors by role) cached once on disk, and the MTP head fetched for builds that dropped it."""
