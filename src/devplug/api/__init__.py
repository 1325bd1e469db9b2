"""The wire APIs: device plugin v1beta1 and PodResources v1, generated from api.proto files."""
