"""Image data for training (MATLAB's imageDatastore, imageDataAugmenter, augmentedImageDatastore).

Datastores are torch Datasets of (image float32 C x H x W in [0, 1], label index) that read files lazily and
pickle small; `device_resident` holds the fast path that keeps a decoded dataset on the training device.
"""

from __future__ import annotations

from nbscale.data.augmented import AugmentedImageDatastore
from nbscale.data.augmenter import ImageAugmenter
from nbscale.data.datastore import ImageDatastore

__all__ = ["ImageDatastore", "ImageAugmenter", "AugmentedImageDatastore"]
