"""What the cluster offers: GPU inventory from Node objects (GFD labels, MIG) and from DRA
ResourceSlices, the node index, node health, the GPU and CUDA tables (pure; imports ``api``)."""
