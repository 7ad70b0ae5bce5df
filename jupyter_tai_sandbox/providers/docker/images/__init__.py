"""The session images, built offline for a Docker engine: the minimal one from Debian's busybox-static and
the Python one with debootstrap (``build``), a derived image with pip packages (``packages``), and the
Python image's Dockerfile for engines that can pull (``dockerfiles/``). Their names are
:mod:`jupyter_tai_sandbox.images`."""
