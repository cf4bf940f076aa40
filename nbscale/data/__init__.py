"""Image data for training (MATLAB's imageDatastore, imageDataAugmenter, augmentedImageDatastore).

Datastores are torch Datasets of (image float32 C x H x W in [0, 1], label index) that read files lazily and
pickle small. The loaders that feed training live here too: `loading` takes training data as a Dataset and
chooses a batch source, `streaming` reads through a DataLoader, `device_resident` keeps a decoded dataset on the
training device. This package imports nothing of nbscale.training (tests/test_layers.py checks it).
"""

from __future__ import annotations

from nbscale.data.augmented import AugmentedImageDatastore
from nbscale.data.augmenter import ImageAugmenter
from nbscale.data.datastore import ImageDatastore

__all__ = ["ImageDatastore", "ImageAugmenter", "AugmentedImageDatastore"]
