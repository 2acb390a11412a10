"""Data: the model and GPU catalogs, each row with its source.

Models are stored as their Hugging Face ``config.json`` (one file each under
``catalog/models/``) and go through the same adapter as a user's own config.
"""

from vramplan.catalog.gpus import gpu_names, list_gpus, resolve_gpu
from vramplan.catalog.models import CatalogModel, list_models, load_model, model_ids

__all__ = ["CatalogModel", "gpu_names", "list_gpus", "list_models", "load_model", "model_ids", "resolve_gpu"]
