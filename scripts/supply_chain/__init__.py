"""The image supply chain: building, testing and pushing the images (images.sh, with engine.sh and
standin_base.sh, CI's stand-in base), their locks (lock.sh, refresh_bases.py), the scan gate
(scan_gate.py), the GPU wheel's kernel list (tensorflow_build_info.py) and the tools a machine needs
for all of it (install_image_tools.sh). Run from the repository root, as docs/images.md shows."""
