import { LabIcon } from '@jupyterlab/ui-components';

/** A box with a prompt: the sandbox panel's sidebar icon. */
const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M12 1.5 2.5 6.5v11L12 22.5l9.5-5v-11L12 1.5zm0 2.3 7.2 3.8L12 11.3 4.8 7.6 12 3.8zM4.5 9.3l6.5 3.4v7.4l-6.5-3.4V9.3zm8.5 10.8v-7.4l6.5-3.4v7.4L13 20.1z"/>
    <path d="M14.2 14.2l1.6.9-1.6.9v1l2.6-1.5v-.8l-2.6-1.5zM15.5 18.2h2v.9h-2z"/>
  </g>
</svg>`;

export const sandboxIcon = new LabIcon({ name: 'jupyter-tai-sandbox:icon', svgstr: svg });

/** The Sandbox drive's file browser: a folder with the box. */
const driveSvg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M10 4H4c-1.1 0-2 .9-2 2v12c0 1.1.9 2 2 2h16c1.1 0 2-.9 2-2V8c0-1.1-.9-2-2-2h-8l-2-2z"/>
  </g>
  <g class="jp-icon-contrast0" fill="#fff">
    <path d="M12 9.2l-4 2.1v4.4l4 2.1 4-2.1v-4.4l-4-2.1zm0 1.2 2.6 1.4-2.6 1.4-2.6-1.4 2.6-1.4z"/>
  </g>
</svg>`;

export const sandboxDriveIcon = new LabIcon({ name: 'jupyter-tai-sandbox:drive', svgstr: driveSvg });
