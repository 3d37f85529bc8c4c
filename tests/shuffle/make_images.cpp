// Writes a small ImageNet-layout folder of JPEGs made from Fashion-MNIST images, for the CLI
// tests: make_images DIR CLASSES TRAIN_PER_CLASS VAL_PER_CLASS
#include <cstdio>
#include <cstdlib>

#include "tests/shuffle/data_fixture.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: make_images DIR CLASSES TRAIN_PER_CLASS VAL_PER_CLASS\n");
    return 2;
  }
  gg::test::make_imagenet(argv[1], std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  return 0;
}
